"""`python -m monitoring.rules [--check]` (`make rules`, `make check-rules`): monitoring/rules/rulegen.py."""

import sys

from monitoring.rules.rulegen import main

sys.exit(main())
