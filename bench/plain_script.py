"""`python -m bench.plain_script PATH [args]`: run a user's script as `python PATH` would, nothing of
ours loaded (no metrics, no hooks): the baseline of bench/script_overhead.py, under bench.launch."""

import runpy
import sys

if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
