"""trainer/bench/allreduce_sweep.py, bench/comm/ and bench/scaling.py: the arithmetic
and formatting, no TensorFlow."""

from __future__ import annotations

import json
import subprocess

import pytest

from bench import comm as bc
from bench import scaling
from contract.benchcomm import Result
from trainer.bench import allreduce_sweep as sweep
from trainer.cluster import server_config


@pytest.mark.parametrize(
    "text, want", [("0", 0), ("4096", 4096), ("256KiB", 256 * 1024), ("16MiB", 16 << 20), ("1gib", 1 << 30)]
)
def test_parse_bytes(text, want):
    assert sweep.parse_bytes(text) == want


@pytest.mark.parametrize("bad", ["", "4 MB", "-1", "MiB"])
def test_parse_bytes_rejects(bad):
    with pytest.raises(ValueError):
        sweep.parse_bytes(bad)


def _patch(monkeypatch, name, value):
    """Replace `name` in every bench.comm module that uses it (each imported it by name)."""
    import sys

    for module in [m for n, m in sys.modules.items() if n.startswith("bench.comm.")]:
        if hasattr(module, name):
            monkeypatch.setattr(module, name, value)


def test_sizes_go_from_4_kib_to_64_mib():
    assert sweep.SIZES[0] == 4 * 1024 and sweep.SIZES[-1] == 64 << 20


@pytest.mark.parametrize("n, factor", [(2, 1.0), (3, 4 / 3), (4, 1.5), (8, 1.75)])
def test_busbw_is_nccl_tests_definition(n, factor):
    assert bc.busbw(100.0, n) == pytest.approx(100.0 * factor)


def test_iterations_amortise_small_sizes_and_stay_at_least_two():
    assert sweep.iterations(4096) == 20
    assert sweep.iterations(4 << 20) == 4
    assert sweep.iterations(64 << 20) == 2


def t(variant, size, *samples, payload="equal8"):
    return {"variant": variant, "payload": payload, "size": size, "samples": list(samples)}


def test_rows_take_the_slowest_task_per_repeat_then_the_median_and_spread():
    timings = [
        t("RING/0", 1 << 20, 0.010, 0.030, 0.012),  # chief
        t("RING/0", 1 << 20, 0.020, 0.011, 0.013),  # worker: each repeat ends with the slower task
        t("RING/0", 4 << 20, 0.050, 0.050, 0.050),
        t("RING/1MiB", 1 << 20, 0.005, 0.005, 0.005),
        t("RING/1MiB", 4 << 20, 0.040, 0.040, 0.040),
    ]
    table = bc.rows(timings, n=3)
    first = table[0]
    assert (first.variant, first.size, first.payload) == ("RING/0", 1 << 20, "equal8")
    assert (first.seconds_min, first.seconds, first.seconds_max) == (0.013, 0.020, 0.030)
    assert first.algbw == pytest.approx((1 << 20) / 0.020)
    assert first.busbw == pytest.approx(first.algbw * 4 / 3)
    best = Result("local", 3, "x", None, tuple(table)).best
    assert (best.variant, best.size) == ("RING/1MiB", 4 << 20), "best = highest busbw at the largest size"


def test_a_winner_is_named_only_beyond_the_spread():
    clear = bc.rows([t("A", 4096, 0.010, 0.011, 0.012), t("B", 4096, 0.013, 0.015, 0.020)], n=2)
    assert bc.winner(clear) == "A"
    overlapping = bc.rows([t("A", 4096, 0.010, 0.011, 0.014), t("B", 4096, 0.013, 0.015, 0.020)], n=2)
    assert bc.winner(overlapping) == "no clear winner"
    assert bc.winner(clear[:1]) == "A"


def test_equal_payloads_hold_the_size_and_named_ones_their_shapes():
    got = sweep.payloads("4096,1048576", {"mlp": [[4, 64], [64]]})
    assert [name for name, _ in got] == ["equal8", "equal8", "mlp"]
    assert [4 * sum(s[0] for s in shapes) for _, shapes in got[:2]] == [4096, 1 << 20]
    assert got[2][1] == [(4, 64), (64,)]


def test_unknown_payload_is_one_line_and_exits():
    with pytest.raises(SystemExit, match="--payloads vgg: unknown, choose from mlp, cnn, resnet50"):
        bc.payload_shapes("mlp,vgg")


def test_payloads_are_the_models_variables():
    """The shapes come from the models (TensorFlow is loaded: the slowest test here, ~10 s)."""
    import math

    from bench import payloads
    from trainer.assembly import task as tasks

    mlp = tasks.build(tasks.load("mlp"), per_replica_batch=1, seed=0).model
    assert payloads.task_shapes("mlp") == [tuple(v.shape) for v in mlp.trainable_variables]
    resnet = payloads.resnet50_like()
    assert len(resnet) == 161 and round(sum(math.prod(s) for s in resnet) / 1e6, 1) == 25.6


def test_what_the_driver_writes_is_what_diagnose_reads(tmp_path, monkeypatch):
    """One schema: bench_comm's output file, read back by `make diagnose`'s reader."""
    from monitoring import diagnose

    out = tmp_path / "bench-comm"
    argv = ["--where", "local", "--payloads", "", "--servers", "", "--out", str(out)]
    results = [{"n": 2, "tf_version": "2.x", "timings": [t("RING/0", s, s / 1e8) for s in (4096, 1 << 20)]}]
    _patch(monkeypatch, "_run_sweep", lambda endpoints, task_args, env=None: (results, 2))
    _patch(monkeypatch, "tcp_throughput", lambda *a, **k: 2e8)
    assert bc.main(argv) == 0
    busbw, size = diagnose.link_reference(out.with_suffix(".json"), 1 << 20)
    assert size == 1 << 20 and busbw == pytest.approx(1e8)


SS = """\
0 0 127.0.0.1:40001 127.0.0.1:2222
0 0 127.0.0.1:2222 127.0.0.1:40001
0 0 127.0.0.1:40002 127.0.0.1:2223
0 0 127.0.0.1:2223 127.0.0.1:40002
0 0 127.0.0.1:40003 127.0.0.1:9999
0 0 [::ffff:127.0.0.1]:40004 [::ffff:127.0.0.1]:2223
"""


def test_connections_between_two_tasks_count_each_once_even_on_one_loopback():
    # chief serves 2222, worker 2223: worker->chief (40001), chief->worker (40002, 40004); 9999 is not theirs
    assert bc.connections_between(SS, ("127.0.0.1", 2222), ("127.0.0.1", 2223)) == 3
    containers = (
        "0 0 10.0.0.2:2223 10.0.0.3:5555\n0 0 10.0.0.2:6666 10.0.0.3:2223\n0 0 10.0.0.2:7 10.0.0.9:2223\n"
    )
    assert bc.connections_between(containers, ("10.0.0.2", 2223), ("10.0.0.3", 2223)) == 2


def test_iperf3_json_receiver_throughput():
    report = {"end": {"sum_sent": {"bits_per_second": 9e9}, "sum_received": {"bits_per_second": 8e9}}}
    assert bc.iperf_bytes_per_second(report) == 1e9


def test_png_is_written(tmp_path):
    table = bc.rows(
        [t(v, s, s / 1e8) for v in ("RING/0", "AUTO/0") for s in (4096, 1 << 20)],
        n=2,
    )
    bc.write_png(table, 2e9, 2, "local", tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes()[:4] == b"\x89PNG"


def test_stack_containers_is_empty_without_docker(monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError("docker")

    monkeypatch.setattr(subprocess, "run", missing)
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
        values[scaling.HISTOGRAMS[part].sum] = total
        values[scaling.HISTOGRAMS[part].count] = steps
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


def test_the_server_ab_runs_each_setting_on_its_own_cluster_and_labels_its_rows(tmp_path, monkeypatch):
    out = tmp_path / "bench-comm"
    calls = []

    def sweep(endpoints, task_args, env=None):
        server = task_args[task_args.index("--server") + 1] if "--server" in task_args else "stock"
        calls.append((server, env or {}))
        timings = [{**t("RING/0", 4096, 1e-3), "cpu": [5e-4] * 3}]
        return [{"n": 2, "tf_version": "2.x", "server": server, "timings": timings}], 2

    _patch(monkeypatch, "_run_sweep", sweep)
    _patch(monkeypatch, "tcp_throughput", lambda *a, **k: 2e8)
    _patch(monkeypatch, "payload_shapes", lambda names: {})
    argv = [
        "--where",
        "local",
        "--payloads",
        "",
        "--servers",
        "stock;recv_buf_max_chunk=-1",
        "--envs",
        "malloc-keep;FOO=a=b",
        "--out",
        str(out),
    ]
    assert bc.main(argv) == 0
    tunables = bc.ENV_CANDIDATES["malloc-keep"].partition("=")[2]
    default, stock = dict(server_config.ENVIRONMENT), dict.fromkeys(server_config.ENVIRONMENT, "")
    # the sweep as every task runs; one cluster per setting on glibc's defaults; then one per
    # environment on the stock server
    assert calls == [
        ("stock", default),
        ("stock", stock),
        ("recv_buf_max_chunk=-1", stock),
        ("stock", {"GLIBC_TUNABLES": tunables}),
        ("stock", {**stock, "FOO": "a=b"}),
    ]
    variants = {r["variant"] for r in json.loads(out.with_suffix(".json").read_text())["rows"]}
    assert {
        "RING/0 stock",
        "RING/0 recv_buf_max_chunk=-1",
        "RING/0 env:malloc-keep",
        "RING/0 env:FOO=a=b",
    } <= variants


def test_a_bad_env_entry_is_one_line_naming_the_candidates():
    with pytest.raises(SystemExit, match="expected NAME=VALUE or one of malloc-thp-keep"):
        bc.env_setting("no-such-setting")


def test_ab_rounds_interleave_the_settings_and_pool_each_cells_repeats(tmp_path, monkeypatch, capsys):
    order = []

    def sweep(endpoints, task_args, env=None):
        label = (env or {}).get("GLIBC_TUNABLES") or "stock"
        order.append(label)
        seconds = 2e-3 if label == "stock" else 1e-3
        timings = [{**t("RING/0", 4096, seconds), "payload": "cnn", "cpu": [5e-4] * 3, "faults": [9] * 3}]
        return [
            {"n": 2, "task": task, "tf_version": "2.x", "server": "stock", "timings": timings}
            for task in ("chief", "worker-0")
        ], 2

    _patch(monkeypatch, "_run_sweep", sweep)
    _patch(monkeypatch, "tcp_throughput", lambda *a, **k: None)
    _patch(monkeypatch, "payload_shapes", lambda names: {})
    argv = ["--where", "local", "--payloads", "", "--sizes", "", "--servers", "stock"]
    argv += ["--envs", "malloc-keep", "--rounds", "3", "--out", str(tmp_path / "b")]
    assert bc.main(argv) == 0
    keep = bc.ENV_CANDIDATES["malloc-keep"].partition("=")[2]
    # the first call is the sweep as every task runs; then stock/keep, keep/stock, stock/keep
    assert order[1:] == ["stock", keep, keep, "stock", "stock", keep]
    ab = json.loads((tmp_path / "b.json").read_text())["rows"]
    out = capsys.readouterr().out
    assert (
        "env:malloc-keep" in out and "load average (1 min) before/after each A/B cluster, 3 round(s)" in out
    )
    assert {r["variant"] for r in ab} >= {"RING/0 stock", "RING/0 env:malloc-keep"}
    pooled = [r for r in ab if r["variant"] == "RING/0 stock"][0]
    assert pooled["seconds"] == pytest.approx(2e-3) and pooled["seconds_max"] == pytest.approx(2e-3)
    # 3 rounds x 3 repeats, both tasks' CPU summed per repeat: 2 x 0.5 ms
    assert "1.00 1.00-1.00" in out


def test_merged_rounds_concatenates_repeats_per_task_and_cell():
    a = {"task": "chief", "variant": "v", "payload": "cnn", "size": 4, "samples": [1], "cpu": [2]}
    b = {**a, "samples": [3], "cpu": [4]}
    other_task = {**a, "task": "worker-0"}
    merged = bc.merged_rounds([a, other_task, b])
    assert [(m["task"], m["samples"], m["cpu"]) for m in merged] == [
        ("chief", [1, 3], [2, 4]),
        ("worker-0", [1], [2]),
    ]
    assert a["samples"] == [1]  # the inputs are not changed


def test_format_rounds_gives_each_clusters_median_of_the_slowest_task():
    chief = {"variant": "v", "payload": "cnn", "size": 4, "samples": [1e-3, 3e-3, 2e-3, 10e-3, 10e-3, 10e-3]}
    worker = {**chief, "samples": [2e-3, 1e-3, 1e-3, 10e-3, 20e-3, 30e-3]}
    assert bc.format_rounds([chief, worker], repeats=3).splitlines()[1].split()[-2:] == ["2.00", "20.00"]


def test_the_turn_order_is_drawn_per_repeat_and_the_same_in_every_task():
    variants = ["RING/0", "AUTO/0", "RING/1MiB", "RING/16MiB"]
    orders = [sweep.turn_order("cnn", r, variants) for r in range(20)]
    assert all(sorted(o) == sorted(variants) for o in orders)
    assert orders == [
        sweep.turn_order("cnn", r, list(variants)) for r in range(20)
    ]  # a fresh task draws the same
    assert {o[0] for o in orders} == set(variants)  # nobody always goes first
    assert variants == ["RING/0", "AUTO/0", "RING/1MiB", "RING/16MiB"]  # the caller's list is left alone
