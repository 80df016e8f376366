"""Write the dashboards (default) or, with --check, fail if the committed JSON differs."""

import argparse
import sys
from pathlib import Path

from monitoring.rules.generated import write_or_check

from . import OUT_DIR, build_all, render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitoring.dashboards", description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="directory for the JSON files")
    parser.add_argument("--check", action="store_true", help="compare with the files instead of writing")
    args = parser.parse_args(argv)
    files = {args.out / name: render(dashboard) for name, dashboard in build_all().items()}
    return write_or_check(files, check=args.check, command="make dashboards")


if __name__ == "__main__":
    sys.exit(main())
