"""The report's pure parts: finding the last run, and drawing a PNG from series (no Prometheus)."""

from monitoring.prom.promql import last_run
from monitoring.report import PARTS, plot


def test_last_run_is_the_last_stretch_without_a_long_gap():
    first, second = [0, 5, 10, 15], [500, 505, 510]
    assert last_run([float(t) for t in first + second], gap=60) == (500.0, 510.0)
    assert last_run([0.0, 5.0, 10.0], gap=60) == (0.0, 10.0)
    assert last_run([], gap=60) is None


def test_plot_writes_a_png(tmp_path):
    xs = [0.0, 5.0, 10.0]
    parts = {label: (xs, [0.01, 0.012, 0.011]) for _, label in PARTS}
    breakdown = {"chief": parts, "worker-0": parts}
    out = tmp_path / "report.png"
    plot(
        breakdown=breakdown,
        throughput={"cluster": (xs, [100.0, 120.0, 110.0])},
        loss={"chief": (xs, [2.3, 2.0, 1.8])},
        title="test",
        out=out,
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
