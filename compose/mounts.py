"""Can the container's user read what SCRIPT= and DATA= bind-mount? Asked before any container starts.

Every task runs as uid:gid 1000:1000 (compose/services.py's trainer `user`). A script in a folder only its
owner can read (what `mktemp -d` makes) is otherwise mounted fine and then "does not exist" inside
every container, which exits 2 after its restarts. Permissions are read from the mode bits as the
kernel applies them to that uid and gid (owner, else group, else other), not with os.access: the
caller is often root, who can read everything.
"""

from __future__ import annotations

import stat
from pathlib import Path

CONTAINER_UID = CONTAINER_GID = 1000
"""The image's unprivileged user, as every service's `user: 1000:1000` runs it."""


def _allowed(path: Path, want: str) -> bool:
    """Whether uid/gid 1000 has every permission in `want` ("r", "x", "rx") on path."""
    st = path.stat()
    if st.st_uid == CONTAINER_UID:
        bits = {"r": stat.S_IRUSR, "w": stat.S_IWUSR, "x": stat.S_IXUSR}
    elif st.st_gid == CONTAINER_GID:
        bits = {"r": stat.S_IRGRP, "w": stat.S_IWGRP, "x": stat.S_IXGRP}
    else:
        bits = {"r": stat.S_IROTH, "w": stat.S_IWOTH, "x": stat.S_IXOTH}
    return all(st.st_mode & bits[p] for p in want)


def _who(path: Path) -> str:
    """The chmod class that applies to uid/gid 1000 for this path."""
    st = path.stat()
    return "u" if st.st_uid == CONTAINER_UID else "g" if st.st_gid == CONTAINER_GID else "o"


def problem(variable: str, path: str, *, is_dir: bool, want: str = "rx") -> str | None:
    """None when the container's user can read `path` (SCRIPT: the file and its folder, which is the
    mount; DATA: the folder; OUTPUT: want "rwx", written too); else one line naming the fault and the
    chmod that fixes it."""
    target = Path(path).resolve()
    if not target.exists():
        return f"{variable}={path}: {target} does not exist"
    if is_dir != target.is_dir():
        return f"{variable}={path}: {target} is not a {'folder' if is_dir else 'file'}"
    folder = target if is_dir else target.parent
    fixes = []
    if not _allowed(folder, want):
        fixes.append(f"chmod {_who(folder)}+{want} {folder}")
    if not is_dir and not _allowed(target, "r"):
        fixes.append(f"chmod {_who(target)}+r {target}")
    if not fixes:
        return None
    return (
        f"{variable}={path}: the containers' user (uid {CONTAINER_UID}) cannot "
        f"{'write' if 'w' in want else 'read'} it, "
        f"it is mounted as is; run: {' && '.join(fixes)}"
    )
