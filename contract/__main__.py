"""`python3 -m contract`: the contract as a Markdown table; `--make`: the make fragment of its shared
ports and defaults (contract/defaults.mk); `--shell`: the same as shell assignments."""

import sys

from contract import make_fragment, shell_lines, table

FORMATS = {"--make": make_fragment, "--shell": shell_lines}

if len(sys.argv) > 2 or (sys.argv[1:] and sys.argv[1] not in FORMATS):
    sys.exit(f"usage: python3 -m contract [{' | '.join(FORMATS)}]")
print(FORMATS[sys.argv[1]]() if sys.argv[1:] else table(), end="" if sys.argv[1:] else "\n")
