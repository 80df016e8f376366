"""Say, for the supervisor, when this task is inside MultiWorkerMirroredStrategy's constructor.

The constructor starts TensorFlow's coordination service, whose preemption notifier takes SIGTERM
(it only records it), then waits for every peer in C++ holding the GIL: no Python signal handler, no
thread, no /metrics runs until the last peer has joined. With a peer gone (killed, its node lost),
`docker stop` of the others (`make down`) waited out Docker's 60 s grace. The file named by
trainer.errors.JOINING_ENV exists while the constructor runs; the supervisor SIGKILLs a task it
has signalled while the file exists: nothing has trained in this run, so nothing is lost.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from trainer.errors import JOINING_ENV


@contextlib.contextmanager
def joining(env: Mapping[str, str] = os.environ) -> Iterator[None]:
    """The file exists for the body's duration (no file when unsupervised: JOINING_ENV unset)."""
    path = Path(env[JOINING_ENV]) if env.get(JOINING_ENV) else None
    if path:
        path.touch()
    try:
        yield
    finally:
        if path:
            path.unlink(missing_ok=True)
