"""bench/tracecheck.py matches a step's marks to the trace's Timestamp ops by the op's span, not by a
fixed distance from its start: on a loaded machine an op preempted before its clock read starts
long before the value it returns ("the trace holds none of the 20 steps' marks" in `make bench`)."""

import numpy as np

from bench import tracecheck


def _trace(marks: np.ndarray, lag: float, offset: float):
    """A Timestamp op per mark, ending just after the value it returned, on a trace clock `offset`
    ahead; each step's t1 op (after the gradients) starts `lag` before its value, the others 1 us
    before; one compute op per step."""
    lags = np.full(marks.shape, 1e-6)
    lags[:, 2] = lag
    events = [(m + offset - d, m + offset + 1e-6, "Timestamp") for m, d in zip(marks.ravel(), lags.ravel())]
    events += [(row[1] + offset + 1e-4, row[2] + offset - 1e-4, "Conv2D") for row in marks]
    return sorted(events)


def _marks(steps: int) -> np.ndarray:
    t0 = 1000.0 + np.arange(steps) * 0.05
    return np.stack([t0 - 1e-3, t0, t0 + 0.02, t0 + 0.03, t0 + 0.04], axis=1)


def test_marks_of_ops_stretched_far_beyond_the_slack_are_found():
    marks = _marks(20)
    lag = 50 * tracecheck.MATCH_S  # a preempted op: its clock read long after its start
    _, held = tracecheck.from_trace(_trace(marks, lag, offset=0.0), marks)
    assert len(held) == 20


def test_a_shifted_trace_clock_is_lined_up():
    marks = _marks(10)
    _, held = tracecheck.from_trace(_trace(marks, 1e-6, offset=3.5), marks)
    assert len(held) == 10


def test_marks_the_trace_lacks_are_left_out():
    marks = _marks(10)
    events = [
        e for e in _trace(marks, 1e-6, 0.0) if not (e[2] == "Timestamp" and abs(e[0] - marks[4, 2]) < 1e-3)
    ]
    _, held = tracecheck.from_trace(events, marks)
    assert len(held) == 9
