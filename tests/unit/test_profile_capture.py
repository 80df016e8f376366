"""TensorBoard from the trainer: the chief's scalars as TensorBoard reads them back, the profile
captures filed one run per task with the last K kept, and `make profile`'s task list."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

import contract
from compose import profile, services
from compose.deployment import LOG_DIR, Deployment
from compose.targets import compose as compose_target
from trainer.core.timing import CallOutput, StepTiming
from trainer.telemetry import profile_capture, tensorboard


def _call(step: int, n: int, loss: float, ms: float | None = 20.0) -> CallOutput:
    t = None if ms is None else StepTiming(step=ms / 1000, input=0.002, compute=0.010, allreduce=0.005)
    return CallOutput(step=step, timings=(t,) * n, loss=loss, accuracy=None, ids=None, now=0.0)


def _events(run: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) per tag, read the way TensorBoard reads event files (with the plugin name)."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(run.glob("events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(str(path)):
            event = event_pb2.Event.FromString(record.numpy())
            for v in event.summary.value:
                assert v.metadata.plugin_data.plugin_name == "scalars", v.tag
                value = tf.make_ndarray(v.tensor).item()
                found.setdefault(v.tag, []).append((event.step, value))
    return found


def test_the_chief_writes_loss_rate_and_breakdown_once_per_interval(tmp_path: Path) -> None:
    action = tensorboard.scalars(str(tmp_path), True, 10, tensorboard.rate_at(lambda s: 0.001 * s))
    for step, loss in ((5, 1.0), (10, 0.8), (15, 0.7), (20, 0.5), (25, 0.4)):
        action(_call(step, 5, loss))
    found = _events(tmp_path / tensorboard.SCALARS_RUN)
    assert found["loss"] == [(10, pytest.approx(0.8)), (20, pytest.approx(0.5))]
    assert found["learning_rate"] == [(10, pytest.approx(0.01)), (20, pytest.approx(0.02))]
    assert [v for _, v in found["step_time/step_ms"]] == [pytest.approx(20.0)] * 2
    other = 20.0 - 2.0 - 10.0 - 5.0
    assert [v for _, v in found["step_time/other_ms"]] == [pytest.approx(other)] * 2
    assert set(found) == set(tensorboard.TAGS.values())


def test_untimed_intervals_write_no_breakdown(tmp_path: Path) -> None:
    action = tensorboard.scalars(str(tmp_path), True, 10, tensorboard.rate_at(0.05))
    action(_call(10, 10, 0.3, ms=None))
    assert set(_events(tmp_path / tensorboard.SCALARS_RUN)) == {"loss", "learning_rate"}


@pytest.mark.parametrize(("logdir", "chief"), [("", True), ("/somewhere", False)])
def test_no_logdir_or_not_the_chief_is_the_no_op_sink(logdir: str, chief: bool) -> None:
    action = tensorboard.scalars(logdir, chief, 10, tensorboard.rate_at(0.1))
    assert isinstance(action, tensorboard.NoScalars)
    action(_call(10, 10, 0.3))


def _capture(staging: Path, name: str, tasks: list[str]) -> Path:
    capture = staging / profile_capture.SESSIONS / name
    capture.mkdir(parents=True)
    for task in tasks:
        (capture / f"{task}_{contract.PROFILER_PORT}.xplane.pb").write_bytes(b"x" * 10)
    return capture


def test_each_task_trace_becomes_its_own_run_and_a_silent_task_is_named(tmp_path: Path) -> None:
    capture = _capture(tmp_path / "staging", "2026_12_01_09_00_00", ["chief", "worker-1"])
    logdir = tmp_path / "logs"
    missing = profile_capture.file_by_task(
        capture, ["chief", "worker-0", "worker-1"], contract.PROFILER_PORT, logdir
    )
    assert missing == ["worker-0"]
    for task in ("chief", "worker-1"):
        assert (logdir / f"profile/{task}/plugins/profile/2026_12_01_09_00_00/{task}.xplane.pb").is_file()


def test_prune_keeps_the_newest_captures_of_every_task(tmp_path: Path) -> None:
    for minute in range(4):
        name = f"2026_12_01_09_0{minute}_00"
        capture = _capture(tmp_path / f"s{minute}", name, ["chief", "worker-0"])
        profile_capture.file_by_task(capture, ["chief", "worker-0"], contract.PROFILER_PORT, tmp_path)
    removed = profile_capture.prune(tmp_path, keep=2)
    assert len(removed) == 4
    for task in ("chief", "worker-0"):
        left = sorted(p.name for p in (tmp_path / f"profile/{task}/plugins/profile").iterdir())
        assert left == ["2026_12_01_09_02_00", "2026_12_01_09_03_00"]


def test_bad_capture_arguments_are_one_line_errors(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        profile_capture.parse_args(["chief", "--logdir", "/x", "--keep", "0"])
    assert exit_.value.code == 2 and "--keep 0: must be 1 or more" in capsys.readouterr().err


def test_make_profile_traces_every_task_of_the_generated_targets(tmp_path: Path) -> None:
    (tmp_path / "targets").mkdir()
    groups = [
        {"targets": [f"{n}:8000"], "labels": {"task_type": t, "task_index": i}}
        for n, t, i in (("worker-1", "worker", "1"), ("chief", "chief", "0"), ("worker-0", "worker", "0"))
    ]
    (tmp_path / "targets" / "trainers.json").write_text(json.dumps(groups))
    args = profile.exec_args(profile.task_names(tmp_path), 1.5, 3)
    assert args[0] == "tensorboard" and args[-3:] == ["chief", "worker-0", "worker-1"]
    assert "--seconds=1.5" in args and "--keep=3" in args and "--logdir=/logs" in args


def test_make_profile_without_a_stack_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert profile.main(["--run-dir", str(tmp_path), "--seconds", "2", "--keep", "5"]) == 2
    assert "run make up first" in capsys.readouterr().err


@pytest.mark.parametrize("gpu_ids", [None, {"chief": ("0",), "worker-0": ("1",)}])
def test_the_tensorboard_service_runs_this_runs_trainer_image_on_bind_addr_only(gpu_ids) -> None:
    d = Deployment(workers=1, image_repo="me/trainer", gpu_ids=gpu_ids)
    service = compose_target.base_file(d)["services"]["tensorboard"]
    port = contract.TENSORBOARD_PORT
    assert service["image"] == d.image() and service["pull_policy"] == "never"
    assert service["ports"] == [f"${{BIND_ADDR:-127.0.0.1}}:{port}:{port}"]
    assert f"--port={port}" in service["command"] and f"--logdir={LOG_DIR}" in service["command"]
    assert service["volumes"] == [f"tensorboard-logs:{LOG_DIR}"]
    assert set(service["networks"]) == {"cluster", "monitoring"}  # make profile reaches every task


def test_every_task_mounts_the_log_volume_and_exposes_its_profiler() -> None:
    for task in services.trainers(Deployment(workers=2)):
        assert ("tensorboard-logs", LOG_DIR) in task.volumes, task.name
        assert contract.PROFILER_PORT in task.expose, task.name
        assert task.environment["TRAINER_LOGDIR"] == LOG_DIR
        assert task.environment["TRAINER_PROFILER_PORT"] == str(contract.PROFILER_PORT)


class _Board(http.server.BaseHTTPRequestHandler):
    """A stand-in TensorBoard on loopback: records each request, answers 404 for worker-1's trace."""

    asked: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        _Board.asked.append(self.path)
        self.send_response(404 if "worker-1" in self.path else 200)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args) -> None:
        pass


def test_each_new_trace_is_converted_once_in_turn_and_a_failure_only_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Board)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Board.asked = []
    try:
        board = f"http://127.0.0.1:{server.server_address[1]}"
        failed = profile_capture.warm(
            board, ["chief", "worker-0", "worker-1"], "2026_12_01_09_00_00", timeout=10
        )
    finally:
        server.shutdown()
    assert failed == ["worker-1"]
    assert _Board.asked == [
        f"/data/plugin/profile/data?run=profile%2F{task}%2F2026_12_01_09_00_00&tag=trace_viewer%40&host={task}"
        for task in ("chief", "worker-0", "worker-1")
    ]
    assert "worker-1: TensorBoard did not convert the trace" in caplog.text


def test_the_capture_converts_through_the_tensorboard_of_its_container() -> None:
    ns = profile_capture.parse_args(["chief", "--logdir", "/x"])
    assert ns.board == f"http://127.0.0.1:{contract.TENSORBOARD_PORT}"
    assert profile.exec_args(["chief"], 2, 5)[0] == services.TENSORBOARD.name
