"""The breakdown checked by something other than itself: TensorFlow's profiler on a local cluster,
through `make bench` (c)'s own path (tracecheck.check, after SETTLE_STEPS steps as the bench's are).

The chief traces one timed call of the `cnn` task (chief + 1 worker); compute and all-reduce summed
from the marks must agree with the same spans read from the trace's op events within TOLERANCE.
"""

import json

import pytest

from tests.cluster.local import launch

pytestmark = [pytest.mark.cluster, pytest.mark.measures]
TOLERANCE = 0.10  # what the benchmark targets; the parts are ~25 ms and ~3 ms per step
TRACE_STEPS = 40
"""Steps of the traced call: per step the marks' all-reduce is the trace's + ~0.04 ms (quiet, 20 steps:
1.81 against 1.78 ms, 2.0 %). Two cold trials were 11.7 % and 12.5 % over: the trace ended a step's
all-reduce when the collective's async event closed, up to 2.2 ms after its unpack had run (fixed in
bench/tracecheck.py; beside a loaded stage after it: 6.28 against 6.24 ms, 0.6 %)."""
MIN_HELD = TRACE_STEPS // 2
"""Steps of the traced call the trace must hold for the sums to mean anything (one matched step would
pass a comparison of one step's ~3 ms all-reduce); test_script_observe.py asks the same of its calls."""


def test_marks_agree_with_the_profiler_trace():
    # 200 settling steps of cnn: minutes on a loaded machine, hence the longer timeout
    out = launch(
        "--module", "bench.tracecheck", "--task", "cnn", "--trace-steps", str(TRACE_STEPS), timeout=1200
    )
    found = [
        line.split("tracecheck-json:", 1)[1] for line in out.stdout.splitlines() if "tracecheck-json:" in line
    ]
    assert out.returncode == 0 and found, out.stdout[-3000:] + out.stderr[-3000:]
    spans = json.loads(found[0])
    print(*(line for line in out.stdout.splitlines() if "tracecheck: " in line), sep="\n")
    assert spans["steps"] >= MIN_HELD, f"the trace held {spans['steps']} of {TRACE_STEPS} steps: {spans}"
    for part in ("compute", "allreduce"):
        ours, theirs = spans["marks"][part], spans["trace"][part]
        assert abs(ours - theirs) <= TOLERANCE * theirs, f"{part}: marks {ours:.4f}s vs trace {theirs:.4f}s"
