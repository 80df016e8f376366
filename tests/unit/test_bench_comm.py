"""trainer/allreduce_sweep.py, trainer/host/bench_comm.py and trainer/host/scaling.py: the arithmetic
and formatting, no TensorFlow."""

from __future__ import annotations

import json

import pytest

from trainer import allreduce_sweep as sweep
from trainer.host import bench_comm as bc
from trainer.host import scaling


@pytest.mark.parametrize(
    "text, want", [("0", 0), ("4096", 4096), ("256KiB", 256 * 1024), ("16MiB", 16 << 20), ("1gib", 1 << 30)]
)
def test_parse_bytes(text, want):
    assert sweep.parse_bytes(text) == want


@pytest.mark.parametrize("bad", ["", "4 MB", "-1", "MiB"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ValueError):
        sweep.parse_bytes(bad)


def test_sizes_go_from_4_kib_to_64_mib():
    assert sweep.SIZES[0] == 4 * 1024 and sweep.SIZES[-1] == 64 << 20


@pytest.mark.parametrize("n, factor", [(2, 1.0), (3, 4 / 3), (4, 1.5), (8, 1.75)])
def test_busbw_is_nccl_tests_definition(n, factor):
    assert bc.busbw(100.0, n) == pytest.approx(100.0 * factor)


def test_iterations_amortise_small_sizes_and_stay_at_least_two():
    assert sweep.iterations(4096) == 20
    assert sweep.iterations(4 << 20) == 4
    assert sweep.iterations(64 << 20) == 2


def test_rows_take_the_slowest_task_and_best_picks_the_largest_size():
    timings = [
        {"variant": "RING/0", "size": 1 << 20, "seconds": 0.010},
        {"variant": "RING/0", "size": 1 << 20, "seconds": 0.020},
        {"variant": "RING/0", "size": 4 << 20, "seconds": 0.050},
        {"variant": "RING/1MiB", "size": 1 << 20, "seconds": 0.005},
        {"variant": "RING/1MiB", "size": 4 << 20, "seconds": 0.040},
    ]
    table = bc.rows(timings, n=3)
    first = table[0]
    assert (first.variant, first.size, first.seconds) == ("RING/0", 1 << 20, 0.020)
    assert first.algbw == pytest.approx((1 << 20) / 0.020)
    assert first.busbw == pytest.approx(first.algbw * 4 / 3)
    best = bc.best(table)
    assert (best.variant, best.size) == ("RING/1MiB", 4 << 20), "best = highest busbw at the largest size"


def test_table_states_the_ratio_to_tcp():
    table = bc.rows([{"variant": "RING/0", "size": 64 << 20, "seconds": 0.5}], n=2)
    text = bc.format_table(table, tcp=1e9)
    assert "64 MiB" in text and "raw TCP (iperf3) between the first two tasks: 1000 MB/s" in text
    assert "best at 64 MiB: RING/0 busbw 134.2 MB/s = 13.4% of raw TCP" in text


def test_iperf3_json_receiver_throughput():
    report = {"end": {"sum_sent": {"bits_per_second": 9e9}, "sum_received": {"bits_per_second": 8e9}}}
    assert bc.iperf_bytes_per_second(report) == 1e9


def test_png_is_written(tmp_path):
    table = bc.rows(
        [
            {"variant": v, "size": s, "seconds": s / 1e8}
            for v in ("RING/0", "AUTO/0")
            for s in (4096, 1 << 20)
        ],
        n=2,
    )
    bc.write_png(table, 2e9, 2, "local", tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_stack_containers_is_empty_without_docker(monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError("docker")

    monkeypatch.setattr(bc.subprocess, "run", missing)
    assert bc.stack_containers("mwms") == {}


# --- scaling ---

METRICS = """# TYPE trainer_steps_total counter
trainer_steps_total{task_type="chief",task_index="0"} %(steps)s
# TYPE trainer_examples_total counter
trainer_examples_total{task_type="chief",task_index="0"} %(examples)s
# TYPE trainer_step_duration_seconds histogram
trainer_step_duration_seconds_bucket{task_type="chief",task_index="0",le="+Inf"} %(steps)s
trainer_step_duration_seconds_sum{task_type="chief",task_index="0"} %(step_sum)s
trainer_step_duration_seconds_count{task_type="chief",task_index="0"} %(steps)s
"""


def test_parse_metrics_keeps_the_counters_and_histogram_sums():
    values = scaling.parse_metrics(METRICS % dict(steps=10, examples=320, step_sum=0.5))
    assert values == {
        "trainer_steps_total": 10,
        "trainer_examples_total": 320,
        "trainer_step_duration_seconds_sum": 0.5,
        "trainer_step_duration_seconds_count": 10,
    }


def snap(at, steps, examples, **sums):
    values = {"trainer_steps_total": steps, "trainer_examples_total": examples}
    for part, total in sums.items():
        values[f"{scaling.HISTOGRAMS[part]}_sum"] = total
        values[f"{scaling.HISTOGRAMS[part]}_count"] = steps
    return scaling.Snapshot(at, values)


def test_point_and_efficiency():
    one = scaling.point(
        1,
        [snap(0, 100, 3200, step=1.0, compute=0.8, allreduce=0.0, input=0.1)],
        [snap(10, 1100, 35200, step=11.0, compute=8.8, allreduce=0.0, input=1.1)],
    )
    assert one.examples_per_s == pytest.approx(3200) and one.steps_per_s == pytest.approx(100)
    assert (one.step_ms, one.compute_ms, one.input_ms) == pytest.approx((10, 8, 1))
    assert one.other_ms == pytest.approx(1)
    two = scaling.point(
        2,
        [snap(0, 0, 0, step=0, compute=0, allreduce=0, input=0)] * 2,
        [snap(10, 500, 16000, step=10, compute=4, allreduce=5, input=0.5)] * 2,
    )
    assert two.examples_per_s == pytest.approx(3200)
    points = scaling.with_efficiency([one, two])
    assert [p.efficiency for p in points] == pytest.approx([1.0, 0.5])
    assert "50%" in scaling.format_table(points)
    json.dumps([p.__dict__ for p in points])
