"""`make tune`: the candidate settings a verdict's advice names, tried on the job's own checkpoint
against its current settings in interleaved turns, with a plain-vs-plain null (docs/tune.md)."""
