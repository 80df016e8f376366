"""The alpha-beta ring model: the fit recovers known parameters, the check and projection read
bench-comm's and scaling's JSON as those tools write them."""

import pytest

from bench import projection
from bench.projection import Ring


def test_fit_recovers_alpha_and_beta_from_exact_ring_times():
    truth = Ring(alpha=50e-6, beta=500e6)
    sizes = [4096, 65536, 2**20, 2**24, 2**26]
    ring = projection.fit(2, [(s, truth.seconds(2, s)) for s in sizes])
    assert ring.alpha == pytest.approx(truth.alpha, rel=1e-6) and ring.beta == pytest.approx(
        truth.beta, rel=1e-6
    )


def test_ring_sends_2_n_minus_1_over_n_of_the_bytes_in_2_n_minus_1_hops():
    ring = Ring(alpha=1e-3, beta=1e6)
    assert ring.seconds(4, 1e6) == pytest.approx(6 * 1e-3 + 1.5)
    assert ring.seconds(1, 1e6) == 0.0


def test_overlap_hides_at_most_the_backward_pass_and_compression_halves_the_bytes():
    ring = Ring(alpha=0.0, beta=1e6)  # 2 tasks: 1 s per MB
    plain = projection.step_seconds(ring, 2, compute=0.3, nbytes=1e6, setting=(False, False))
    assert plain == pytest.approx(1.3)
    assert projection.step_seconds(ring, 2, compute=0.3, nbytes=1e6, setting=(False, True)) == pytest.approx(
        0.8
    )
    assert projection.step_seconds(ring, 2, compute=0.3, nbytes=1e6, setting=(True, False)) == pytest.approx(
        1.1
    )


def test_report_checks_the_model_against_measured_task_counts():
    truth = Ring(alpha=100e-6, beta=300e6)
    bench = {
        "n": 2,
        "best": {"variant": "RING/0"},
        "rows": [
            {"variant": "RING/0", "size": s, "seconds": truth.seconds(2, s)} for s in (4096, 2**20, 2**26)
        ],
    }
    points = [
        {"tasks": 1, "compute_ms": 4.0, "allreduce_ms": 0.0, "allreduce_bytes_per_step": 1e6},
        {
            "tasks": 3,
            "compute_ms": 9.0,
            "allreduce_ms": 1000 * truth.seconds(3, 1e6),
            "allreduce_bytes_per_step": 1e6,
        },
    ]
    text = projection.report({"points": points}, bench)
    assert "3 tasks:" in text and ("(error +0%)" in text or "(error -0%)" in text), text
    assert len([line for line in text.splitlines() if "|" in line]) == 1 + 3 * 5
