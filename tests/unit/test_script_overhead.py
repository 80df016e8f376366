"""bench/script_overhead.py reads the user's script's own epoch lines: rate and CPU per step, the
tracing epoch left out (tests/scripts/fit_cnn.py prints them)."""

import pytest

from bench import script_overhead as so

OUT = """[chief] epoch 0 done, loss 0.6931, 9.000 s, 12.000 s CPU
[worker-0] epoch 0 done, loss 0.6931, 9.000 s, 12.000 s CPU
[chief] epoch 1 done, loss 0.5000, 2.000 s, 3.000 s CPU
[chief] epoch 2 done, loss 0.4000, 3.000 s, 5.000 s CPU
"""


def test_rate_and_cpu_per_step_leave_the_tracing_epoch_out():
    run = so.measure(OUT, steps_per_epoch=100)
    assert run.rate == pytest.approx(200 / 5.0)
    assert run.cpu_ms == pytest.approx(1e3 * 8.0 / 200)


def test_no_epoch_lines_is_an_error_with_the_output():
    with pytest.raises(RuntimeError, match="no epoch timing lines"):
        so.measure("[chief] Traceback ...", steps_per_epoch=100)


@pytest.mark.parametrize(
    "pattern", [lambda i: 30.0 + i, lambda i: 26.0 if i % 2 else 35.0], ids=["drift", "alternation"]
)
@pytest.mark.parametrize("order", [["plain", "observed"], ["plain", "observed", "no-marks"]])
def test_a_round_cancels_a_drift_and_an_alternation(monkeypatch, pattern, order):
    """Identical settings measured under a load that drifts, or alternates slow-fast, come out equal:
    each setting's mean is over positions i and n-1-i of the round."""
    positions = iter(range(100))

    def fake(module, args, extra=None):
        rate = pattern(next(positions))
        return so.Run(rate, 1000 / rate)

    monkeypatch.setattr(so, "one_run", fake)
    for r in range(3):
        means = so.one_round(order, r, None)
        assert len({round(m.rate, 9) for m in means.values()}) == 1, (r, means)
