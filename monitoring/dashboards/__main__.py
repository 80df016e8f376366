"""Write the dashboards (default) or, with --check, fail if the committed JSON differs."""

import argparse
import sys
from pathlib import Path

from . import OUT_DIR, build_all, render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitoring.dashboards", description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="directory for the JSON files")
    parser.add_argument("--check", action="store_true", help="compare with the files instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for name, dashboard in build_all().items():
        path = args.out / name
        text = render(dashboard)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run `make dashboards`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
