"""The /metrics probe: what the supervisor reads of its task and its peers, by regular expressions over
the exposition text (standard library only; the names come from contract/): the last checkpoint step
(the budget), the global step and the step histogram's p99 (the stall watch), the input step (who is
behind). A page that cannot be read is None, never an error.
"""

from __future__ import annotations

import http.client
import re
import urllib.request

import contract

STATE_LINE = re.compile(
    rf'^{contract.STATE.name}{{[^}}]*{contract.STATE.client_name}="([a-z_]+)"[^}}]*}} 1(?:\.0)?$',
    re.MULTILINE,
)
TARGET_LINE = re.compile(rf"^{contract.TARGET_STEPS.name}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
INPUT_LINE = re.compile(rf"^{contract.INPUT_STEP.name}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
STEP_LINE = re.compile(rf"^{contract.GLOBAL_STEP.name}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
BUCKET_LINE = re.compile(rf'^{contract.STEP.name}_bucket{{[^}}]*le="([^"]+)"[^}}]*}} (\S+)$', re.MULTILINE)
CHECKPOINT_LINE = re.compile(rf"^{contract.LAST_CHECKPOINT.name}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)


def checkpoint_step(url: str) -> int | None:
    """The child's last checkpoint step from its /metrics, or None (not up, or metrics disabled)."""
    text = metrics_text(url)
    if text is None:
        return None
    return max((int(float(v)) for v in CHECKPOINT_LINE.findall(text)), default=None)


def metrics_text(url: str) -> str | None:
    """The child's /metrics page, or None: metrics disabled, not up yet, or gone. A child that exits
    while it answers cuts the page short (http.client.IncompleteRead, not an OSError): that is gone too,
    not a crash of the supervisor (seen at a job's end: the task's container then exited 1)."""
    if not url:
        return None
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.read().decode()
    except (OSError, ValueError, http.client.HTTPException):
        return None


def step_and_p99(url: str) -> tuple[int | None, float | None]:
    """The child's global step and the p99 of its step histogram (upper bucket bound), from /metrics."""
    text = metrics_text(url)
    if text is None:
        return None, None
    steps = [int(float(v)) for v in STEP_LINE.findall(text)]
    states = STATE_LINE.findall(text)
    targets = [float(v) for v in TARGET_LINE.findall(text)]
    if states and "training" not in states:  # saving, done (the final export, the metrics linger): not stuck
        steps = []
    if steps and targets and 0 < max(targets) <= max(steps):  # the last step is done: the end of the job
        steps = []  # (final collectives, save, export) waits for the slowest task, it is no frozen step
    return (max(steps) if steps else None), p99(
        [(float(le), float(count)) for le, count in BUCKET_LINE.findall(text)]
    )


def input_step(url: str) -> int | None:
    """The step whose batch the task at `url` has taken (contract.INPUT_STEP), or None."""
    text = metrics_text(url)
    if text is None:
        return None
    values = [float(v) for v in INPUT_LINE.findall(text) if v.lower() != "nan"]
    return int(max(values)) if values else None


def p99(buckets: list[tuple[float, float]]) -> float | None:
    """The upper bound of the bucket holding the 99th percentile of cumulative `(le, count)` buckets."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0
    if not total:
        return None
    finite = [(le, count) for le, count in buckets if count >= 0.99 * total and le != float("inf")]
    return finite[0][0] if finite else max(le for le, _ in buckets if le != float("inf"))
