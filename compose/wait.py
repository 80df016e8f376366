"""`make wait`: block until the training job is over and exit with the chief's final exit code.

Over means: the chief exited 0 (done); or exited 1-127 (permanent failure: restarting cannot help,
trainer/errors.py); or exited 128-255 (retryable) and Docker will not restart it again (the
`on-failure:N` budget is spent). A retryable exit that Docker restarts is not the end.
`docker wait` returns at every exit, restarts included; by then Docker has already marked the
container `restarting` or `exited`, so one inspect tells the two apart without polling.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence

Runner = Callable[[Sequence[str]], str]


def docker(cmd: Sequence[str]) -> str:
    return subprocess.run(["docker", *cmd], capture_output=True, text=True, check=True).stdout.strip()


def is_final(code: int, status: str) -> bool:
    return code == 0 or 1 <= code <= 127 or status == "exited"


def wait(container: str, run: Runner = docker, log: Callable[[str], None] = print) -> int:
    code = 125  # Docker's own "could not run" code, if the container vanishes before exiting once
    while True:
        try:
            code = int(run(["wait", container]))
            status, restarts = run(["inspect", "-f", "{{.State.Status}} {{.RestartCount}}", container]).split()
        except subprocess.CalledProcessError:
            log(f"wait: the chief container was removed (make down?); last exit code {code}")
            return code
        if is_final(code, status):
            kind = "done" if code == 0 else "failed for good" if code <= 127 else "gave up after restarts"
            log(f"wait: chief {kind}: exit code {code} after {restarts} restart(s)")
            return code
        log(f"wait: chief exited {code} (retryable); Docker restarts it (restart {int(restarts)})")


def main(argv: Sequence[str]) -> int:
    project = argv[0] if argv else "mwms"
    found = docker(["ps", "-aq", "--filter", f"label=com.docker.compose.project={project}",
                    "--filter", "label=com.docker.compose.service=chief"]).split()
    if not found:
        print(f"wait: no chief container in project {project}: run `make up` first", file=sys.stderr)
        return 125
    return wait(found[0], log=lambda m: print(m, file=sys.stderr))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
