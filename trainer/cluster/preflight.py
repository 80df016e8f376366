"""Preflight: reach every peer over TCP before TensorFlow is started, instead of hanging forever.

TensorFlow waits for missing peers with an infinite timeout and no log line. Here each task first
listens on its own port (so peers see it before its ~6 s TensorFlow import is over), then connects
to every peer until all answer, logging the missing ones every 10 s, and gives up with exit code 3
after --cluster-timeout. The listener is closed just before TensorFlow binds the same port.
A peer that ended for good answers there with trainer.errors.FINAL_NOTICE (its supervisor): this
task then ends at once with exit 5 (PeerFailedError) instead of waiting for it.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable

from trainer.cluster.spec import ClusterSpec, TaskId
from trainer.errors import FINAL_NOTICE, MissingPeersError, PeerFailedError

log = logging.getLogger(__name__)
LOG_INTERVAL_S = 10.0
RETRY_INTERVAL_S = 0.5
NOTICE_READ_S = 0.3
"""How long a probe listens for a final notice: a live listener closes at once, TensorFlow's server
sends its HTTP/2 settings or nothing."""
FAILED = "failed for good"


class Listener:
    """Accepts and drops connections on this task's port until TensorFlow takes the port over."""

    def __init__(self, port: int, host: str = "") -> None:
        """`host`: ClusterSpec.listen_host (loopback in a local cluster); "" every address."""
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._serve, name="preflight-listener", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed by close()
                return
            conn.close()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=1)


def probe(address: str, timeout: float = 1.0) -> str | None:
    """None if `address` accepts a TCP connection, else a short reason."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            return _notice(sock)
    except socket.gaierror:
        return "name does not resolve"
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return "timed out"
    except OSError as err:
        return err.strerror or type(err).__name__


def _notice(sock: socket.socket) -> str | None:
    """`failed for good: exit N (why)` if the peer's supervisor answers with a final notice, else None."""
    sock.settimeout(NOTICE_READ_S)
    try:
        data = sock.recv(1024)
    except OSError:
        return None
    if not data.startswith(FINAL_NOTICE):
        return None
    code, _, why = data[len(FINAL_NOTICE) :].decode(errors="replace").strip().partition(" ")
    return f"{FAILED}: exit {code} ({why})" if why else f"{FAILED}: exit {code}"


def wait_for_peers(
    spec: ClusterSpec,
    timeout: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    probe: Callable[[str], str | None] = probe,
) -> None:
    """Return once every peer answers; raise MissingPeersError naming the missing ones at `timeout`."""
    start = clock()
    next_log = start + LOG_INTERVAL_S
    missing: dict[TaskId, str] = {t: "not tried" for t in spec.peers}
    while True:
        for task in list(missing):
            reason = probe(spec.address(task))
            if reason and reason.startswith(FAILED):
                raise PeerFailedError(f"{task.name} ({spec.address(task)}) {reason}; ending this task too")
            if reason is None:
                del missing[task]
            else:
                missing[task] = reason
        if not missing:
            log.info("preflight: all %d peers reachable after %.1fs", len(spec.peers), clock() - start)
            return
        elapsed = clock() - start
        if elapsed >= timeout:
            raise MissingPeersError(
                f"peers unreachable after {timeout:g}s (--cluster-timeout): " + _describe(spec, missing)
            )
        if clock() >= next_log:
            log.warning("waiting for %s, %.0fs/%gs", _describe(spec, missing), elapsed, timeout)
            next_log += LOG_INTERVAL_S
        sleep(min(RETRY_INTERVAL_S, max(0.0, timeout - elapsed)))


def _describe(spec: ClusterSpec, missing: dict[TaskId, str]) -> str:
    return ", ".join(f"{t.name} ({spec.address(t)}): {why}" for t, why in sorted(missing.items()))


def own_port(spec: ClusterSpec) -> int:
    return int(spec.address(spec.task).rpartition(":")[2])
