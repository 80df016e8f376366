"""The verdicts: why a cluster is slow (verdict.py, its case table), what `make tune` and `make
compare` measured (measured.py) and the statistics a comparison rests on (steady.py) with its rate
of differences called by chance (chance.py). Pure: no I/O
but reading the measured files. Nothing is imported here."""
