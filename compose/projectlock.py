"""One lock per project: up, down, clean, resize, tune, applying a tune's winner change the same job,
so one of them at a time; a swarm stack's stack-up, stack-down, stack-resize and stack-elastic likewise
(its lock in its bundle's folder, SWARM_DIR).

    with ProjectLock(run_dir, "make resize WORKERS=3", project="mwms"):
        ...                      # LockHeld: "... make up (pid 123) holds it since 12:01:05 ..." (exit 2)

flock on RUN_DIR/.lock: the kernel frees it when its holder dies, however it dies. The file names the
holder (command, pid, since), written once the lock is held and emptied on release, so a refused
command says who holds it, and a lock found free with a holder still named was left by a process that
died holding it: taken over, and said so. Standard library only.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

NAME = ".lock"


class LockHeld(RuntimeError):
    """Another command of the project holds the lock: the one line to print (exit 2)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ProjectLock:
    def __init__(
        self,
        run_dir: Path,
        command: str,
        project: str,
        wait: bool = False,
        say: Callable[[str], None] = lambda line: None,
        label: str = "PROJECT",
    ) -> None:
        self.path = Path(run_dir) / NAME
        self.command, self.project, self.wait, self.say = command, project, wait, say
        self.name = f"{label}={project}"
        """How the user names it: PROJECT=mwms (a Compose stack), STACK=mwms (a swarm stack)."""
        self._fd: int | None = None

    def holder(self) -> dict:
        try:
            return json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}

    def acquire(self) -> ProjectLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if self.wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(fd)
            raise LockHeld(self._refusal(self.holder())) from None
        left = self.holder()
        if left.get("pid") and left.get("pid") != os.getpid() and not _alive(int(left["pid"])):
            self.say(
                f"took over {self.name}'s lock from `{left.get('command', '?')}` (pid {left['pid']}, "
                f"since {left.get('since', '?')}), which died holding it"
            )
        os.ftruncate(fd, 0)
        holder = {"command": self.command, "pid": os.getpid(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd
        # Released at a normal exit too (a tune holds it until it ends): a holder left named in the file
        # made the next command say it "took over" from a process that had simply finished.
        atexit.register(self.release)
        return self

    def _refusal(self, held: dict) -> str:
        who = f"`{held.get('command', 'another command')}` (pid {held.get('pid', '?')}) holds it since {held.get('since', '?')}"
        return (
            f"{self.name} is busy: {who} ({self.path}); wait for it to finish, "
            "or stop it (a lock whose holder died is taken over)"
        )

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> ProjectLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
