"""The failure notice: failing as a group. After a final exit 1, 2 or 4 the supervisor answers on the
task's cluster port (`mwms-final <code> <why>`, trainer.errors.FINAL_NOTICE) for SUPERVISE_NOTICE_SECONDS
(default 60) or until every peer has connected: peers restarting after the lost collective read it in
their preflight and end with exit 5 at once, instead of waiting for it round after round.
"""

from __future__ import annotations

import socket
import time

from trainer.errors import EXIT_CONFIG, EXIT_FAILED, EXIT_GAVE_UP

NOTICE_ENV = "SUPERVISE_NOTICE_SECONDS"
DEFAULT_NOTICE_S = 60.0
NOTICE_CODES = (EXIT_FAILED, EXIT_CONFIG, EXIT_GAVE_UP)
"""Finals a peer must hear of: 3 is every task's own timeout, 5 is already the echo of another's final."""


def announce(port: int, peers: int, text: bytes, seconds: float) -> int:
    """Answer `text` to whoever connects to `port` until `peers` distinct hosts have, or `seconds`
    pass; how many hosts were told (0 if the port cannot be bound)."""
    told: set[str] = set()
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", port))
        sock.listen(16)
    except OSError:
        return 0
    deadline = time.monotonic() + seconds
    with sock:
        while len(told) < peers and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                conn, (host, _port) = sock.accept()
            except OSError:  # timed out
                break
            with conn:
                try:
                    conn.sendall(text)
                    told.add(host)
                except OSError:
                    pass
    return len(told)
