"""The one crash-safe write: a JSON document appears whole or not at all.

Written to `<path>.tmp` in the same folder, flushed and fsynced, renamed over `path` (atomic on POSIX),
then the folder is fsynced so the rename itself survives a power loss. A kill mid-write leaves the
previous document (and at most a stale `.tmp`, overwritten by the next write). Standard library only:
the supervisor uses it too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping


def fsync_path(path: str) -> None:
    """Flush a file's or a folder's metadata and data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: str, body: Mapping[str, object], *, indent: int | None = None) -> str:
    """Replace `path` with `body` as JSON (one trailing newline); returns `path`."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(body, f, indent=indent)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(os.path.dirname(path) or ".")
    return path
