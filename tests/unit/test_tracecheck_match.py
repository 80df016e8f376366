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
    _, held, _ = tracecheck.from_trace(_trace(marks, lag, offset=0.0), marks)
    assert len(held) == 20


def test_a_shifted_trace_clock_is_lined_up():
    marks = _marks(10)
    _, held, _ = tracecheck.from_trace(_trace(marks, 1e-6, offset=3.5), marks)
    assert len(held) == 10


def test_a_step_none_of_whose_marks_is_traced_is_left_out():
    marks = _marks(10)
    events = [
        e
        for e in _trace(marks, 1e-6, 0.0)
        if not (e[2] == "Timestamp" and any(abs(e[1] - m) < 1e-5 for m in marks[4]))
    ]
    _, held, _ = tracecheck.from_trace(events, marks)
    assert len(held) == 9


def test_steps_of_which_the_trace_kept_one_timestamp_are_compared():
    """A settled function: TensorFlow traced 1 of the 5 Timestamp ops per step (all 5 were required
    before, and `make bench` (c) found none of the 20 steps). Real steps jitter (a perfectly regular
    one would line a mark up with its neighbour's op as well as with its own)."""
    rng = np.random.default_rng(0)
    gaps = np.stack([np.full(20, 1e-3), *(0.01 + rng.uniform(0, 2e-3, (3, 20)))], axis=1)
    marks = 1000.0 + np.arange(20)[:, None] * 0.05 + np.cumsum(gaps, axis=1)
    kept = {round(row[2], 9) for row in marks}  # each step's t1 op only
    events = [
        e for e in _trace(marks, 1e-6, 2.0) if e[2] != "Timestamp" or round(e[1] - 2.0 - 1e-6, 9) in kept
    ]
    assert sum(e[2] == "Timestamp" for e in events) == 20
    theirs, held, _ = tracecheck.from_trace(events, marks)
    assert len(held) == 20
    compute = sum(row[2] - row[1] - 2e-4 for row in marks)  # the Conv2D op of every step
    assert abs(theirs.compute - compute) < 1e-6


def test_with_no_timestamp_traced_the_steps_inside_the_traced_span_are_compared():
    """CI: "the trace holds no timestamps" after the function settled. Both clocks are CLOCK_REALTIME:
    the steps with an op traced between their t0 and t3 are compared, at offset 0."""
    marks = _marks(10)
    events = [e for e in _trace(marks, 1e-6, 0.0) if e[2] != "Timestamp"]
    events = [e for e in events if e[0] < marks[7, 1]]  # the trace ends before step 7
    theirs, held, offset = tracecheck.from_trace(events, marks)
    assert offset == 0.0 and len(held) == 7
    assert abs(theirs.compute - sum(row[2] - row[1] - 2e-4 for row in marks[:7])) < 1e-6


def test_the_all_reduce_ends_with_its_unpack_when_the_collectives_event_closes_later():
    """An async kernel's event closes after its done callback, which can run the unpack and the t2 mark
    first: a loaded trial had the collective's event close 2.2 ms after its split, in 6 of 40 steps
    (the trace's all-reduce 12.5 % over the marks'). Seen per step: concat, launch, split, t2, close."""
    marks = _marks(5)
    events = _trace(marks, 1e-6, 0.0)
    for row in marks:
        t1, t2 = row[2], row[3]
        events += [
            (t1 + 1e-5, t1 + 4e-5, "ConcatV2"),
            (t1 + 1e-4, t1 + 1.1e-4, tracecheck.LAUNCH),
            (t1 + 1e-4, t2 + 2.2e-3, "CollectiveReduceV2"),  # closes after t2
            (t2 - 6e-5, t2 - 2e-5, "SplitV"),
        ]
    theirs, held, _ = tracecheck.from_trace(sorted(events), marks)
    assert len(held) == 5
    per_step = theirs.allreduce / 5
    assert abs(per_step - (0.01 - 1e-5 - 2e-5)) < 1e-9, per_step  # concat start to split end
