import sys

from bench.comm.cli import main

sys.exit(main())
