"""Writing generated files, or checking that the committed ones equal what the generator writes."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(files: dict[Path, str], *, check: bool, command: str) -> int:
    """Write every file (exit 0) or, with check, write nothing and return 1 naming the stale ones."""
    stale = []
    for path, text in files.items():
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date (run `{command}`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0
