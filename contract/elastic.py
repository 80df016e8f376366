"""The defaults of a Swarm job that changes size by itself (`make stack-elastic`, compose/elastic.py).

Written once, here: make's help, the controller and the docs read them from this file. Standard
library only.
"""

from __future__ import annotations

MIN_WORKERS = 1
"""The fewest workers besides the chief the job goes on with when nodes are lost (MIN_WORKERS=)."""
RESIZE_AFTER_RESTARTS = 1.0
"""RESIZE_AFTER when not given: this many times the job's measured restart (a stack-resize's stop to the
chief's start, or the deploy to its start). Waiting for a lost node as long as going on without it
costs, then resizing, is never worse than twice the best choice made in hindsight (ski rental)."""
RESIZE_AFTER_FLOOR_S = 30.0
"""The least RESIZE_AFTER sized from a measurement: a node whose engine restarts is Ready again within
seconds, and a quick restart measured on idle nodes must not make a reboot a resize."""
RESIZE_AFTER_UNMEASURED_S = 180.0
"""RESIZE_AFTER before any restart of this job was measured (the controller started after its chief's
logs went with a lost node)."""
POLL_S = 5.0
"""How often the controller reads Swarm: the manager marks a lost node Down after ~10-15 s."""


def resize_after(measured_restart_s: float | None) -> float:
    """RESIZE_AFTER sized from the job's measured restart (None: not measured)."""
    if measured_restart_s is None:
        return RESIZE_AFTER_UNMEASURED_S
    return max(RESIZE_AFTER_FLOOR_S, RESIZE_AFTER_RESTARTS * measured_restart_s)
