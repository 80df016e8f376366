"""trainer.supervise.supervisor with real child processes: which exits are retried, the budget, signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from trainer.cluster import preflight
from trainer.cluster.spec import TaskId
from trainer.errors import EXIT_GAVE_UP
from trainer.supervise import budget, exits, probe, stall
from trainer.supervise import settings as supervise_settings
from trainer.supervise import supervisor as supervise

ROOT = Path(__file__).resolve().parents[2]


def child(tmp_path: Path, body: str) -> tuple[str, ...]:
    """A Python child that knows its run number (`run`, from 1) and can report a checkpoint step."""
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(f"""\
        import os, signal, sys, time
        from pathlib import Path
        runs = Path({str(tmp_path / "runs")!r})
        run = len(runs.read_text()) + 1 if runs.exists() else 1
        runs.write_text("x" * run)
        def checkpoint(step):
            Path({str(tmp_path / "step")!r}).write_text(str(step))
            time.sleep(1.0)  # polls (every 0.05 s) see it, even on a loaded machine
        """)
        + textwrap.dedent(body)
    )
    return (sys.executable, str(script))


def runs(tmp_path: Path) -> int:
    return len((tmp_path / "runs").read_text())


def supervisor(tmp_path: Path, command: tuple[str, ...], max_restarts: int = 2) -> supervise.Supervisor:
    def progress(_url: str) -> int | None:
        step = tmp_path / "step"
        text = step.read_text() if step.exists() else ""
        return int(text) if text else None  # write_text truncates first: a poll can read it empty

    settings = supervise.Settings(command=command, max_restarts=max_restarts, restart_delay=0.01, poll=0.05)
    return supervise.Supervisor(
        settings,
        log=lambda _m: None,
        probes=supervise.Probes(progress=progress, steps=lambda _u: (None, None)),
    )


@pytest.mark.parametrize(
    ("body", "code", "expected_runs"),
    [
        ("sys.exit(0)", 0, 1),
        ("sys.exit(2)", 2, 1),  # bad configuration: never retried
        ("sys.exit(1)", 1, 1),  # permanent failure
        ("sys.exit(3)", 3, 1),  # a peer never came: final on the first run
        ("sys.exit(201 if run < 3 else 0)", 0, 3),  # preempted twice, then done
        ("sys.exit(200 if run == 1 else 3 if run == 2 else 0)", 0, 3),  # a peer missing while recovering
        ("sys.exit(200 if run == 1 else 2)", 2, 2),  # retryable, then final
        ("os.kill(os.getpid(), signal.SIGKILL) if run == 1 else sys.exit(0)", 0, 2),  # a crash
        ("sys.exit(200)", EXIT_GAVE_UP, 3),  # budget 2: the third failure is the last
    ],
)
def test_exit_codes(tmp_path: Path, body: str, code: int, expected_runs: int) -> None:
    assert supervisor(tmp_path, child(tmp_path, body)).run() == code
    assert runs(tmp_path) == expected_runs


def test_a_new_checkpoint_renews_the_budget(tmp_path: Path) -> None:
    # Budget 1, six failures: survivable only because every run saves a newer checkpoint first.
    body = "checkpoint(100 * run); sys.exit(200 if run <= 6 else 0)"
    assert supervisor(tmp_path, child(tmp_path, body), max_restarts=1).run() == 0
    assert runs(tmp_path) == 7


def test_failures_without_a_new_checkpoint_spend_the_budget(tmp_path: Path) -> None:
    body = "checkpoint(100); sys.exit(200)"  # the same step every time: no progress
    assert supervisor(tmp_path, child(tmp_path, body), max_restarts=2).run() == EXIT_GAVE_UP
    assert runs(tmp_path) == 3


def run_cli(tmp_path: Path, body: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.supervise.supervisor", "--", *child(tmp_path, body)],
        cwd=ROOT,
        env={**os.environ, "TRAINER_METRICS_PORT": "0", **(env or {})},
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigterm_is_forwarded_and_the_child_is_not_restarted(tmp_path: Path) -> None:
    body = """\
        signal.signal(signal.SIGTERM, lambda *_: (Path(sys.argv[0] + ".term").write_text("1"), sys.exit(201)))
        Path(sys.argv[0] + ".ready").write_text("1")
        time.sleep(60)
        """
    proc = run_cli(tmp_path, body)
    deadline = time.time() + 30
    while not (tmp_path / "child.py.ready").exists():
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 201  # the child's own code (a preemption: it saved)
    assert (tmp_path / "child.py.term").exists()  # the child got the signal
    assert runs(tmp_path) == 1  # ... and was not restarted: the container is stopping
    assert "after SIGTERM" in proc.stderr.read()


def test_cli_takes_the_budget_from_the_environment_and_says_why_it_gives_up(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "sys.exit(200)", env={supervise.MAX_RESTARTS_ENV: "1"})
    assert proc.wait(timeout=60) == EXIT_GAVE_UP
    assert runs(tmp_path) == 2
    last = proc.stderr.read().strip().splitlines()[-1]
    assert last.startswith(
        "supervise: exited 200 (peer lost): gave up, 1 restart(s) without a new checkpoint"
    ), last


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["--", "python"],
            {supervise.MAX_RESTARTS_ENV: "lots"},
            "SUPERVISE_MAX_RESTARTS='lots': must be an integer",
        ),
        (["--max-restarts", "-1", "--", "python"], {}, "must be 0 or more"),
        ([], {}, "no command to supervise"),
        (["--", "/nonexistent/trainer"], {}, "cannot run '/nonexistent/trainer'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert supervise.main(argv, env) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reads_the_checkpoint_step_from_the_trainers_own_metrics() -> None:
    from trainer.telemetry import metrics as metrics_lib

    assert probe.checkpoint_step("") is None  # metrics disabled: no progress is ever seen
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    metrics, server = metrics_lib.for_task(TaskId("worker", 1), port=port)
    try:
        assert probe.checkpoint_step(url) == 0
        metrics.checkpointed(300)
        assert probe.checkpoint_step(url) == 300
    finally:
        server.close()
    assert probe.checkpoint_step(url) is None  # the child is gone


def test_a_metrics_page_cut_short_by_the_childs_exit_reads_as_no_answer() -> None:
    """The child exits while it answers: the page ends before its Content-Length (IncompleteRead, an
    http.client.HTTPException, not an OSError). It crashed the supervisor at a job's end (CI)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"

    def answer_cut_short() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 18924\r\n\r\ntrainer_global_step 6")

    threading.Thread(target=answer_cut_short, daemon=True).start()
    try:
        assert probe.step_and_p99(url) == (None, None)
        assert probe.checkpoint_step(url) is None
        assert probe.input_step(url) is None
    finally:
        listener.close()


def test_the_step_counts_as_frozen_only_while_the_trainer_trains() -> None:
    from trainer.telemetry import metrics as metrics_lib

    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    metrics, server = metrics_lib.for_task(TaskId("worker", 1), port=port)
    try:
        metrics.state("training")
        metrics.global_step.set(600)
        metrics.watch_input(lambda: 601)
        assert probe.step_and_p99(url)[0] == 600 and probe.input_step(url) == 601
        for state in ("checkpointing", "done"):  # the final save and export, the metrics linger
            metrics.state(state)
            assert probe.step_and_p99(url)[0] is None, state
        metrics.state("training")
        metrics.target(600)  # the last step done: the end of the job waits for the slowest task
        assert probe.step_and_p99(url)[0] is None
        metrics.target(700)
        assert probe.step_and_p99(url)[0] == 600
    finally:
        server.close()
    clock = [0.0]
    watch = stall.StallWatch(stall.StallBound(20, 10, 60), lambda: clock[0])
    for t, step in ((0, 1), (1, 2), (5, None), (14, 2), (15, 2)):  # saving from 5 s: the clock starts at 14
        clock[0] = t
        assert watch.saw(step, 0.01) == ""
    clock[0] = 25
    assert watch.saw(2, 0.01).startswith("step stuck at 2 for 11s")


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (0, "done"),
        (2, "bad configuration"),
        (3, "missing peers"),
        (200, "peer lost"),
        (201, "preempted"),
        (137, "killed by SIGKILL"),
        (-9, "killed by SIGKILL"),
        (143, "killed by SIGTERM"),
        (250, "retryable"),
        (7, "final"),
    ],
)
def test_meaning(code: int, words: str) -> None:
    assert exits.meaning(code) == words


def stateful(tmp_path: Path, command: tuple[str, ...], **kw) -> supervise.Supervisor:
    """A supervisor keeping its state in tmp_path/state.json: a new one is the container restarted."""
    settings = supervise.Settings(
        command=command,
        max_restarts=2,
        restart_delay=0.01,
        poll=0.05,
        state_file=str(tmp_path / "state.json"),
        **kw,
    )
    return supervise.Supervisor(
        settings,
        log=lambda _m: None,
        probes=supervise.Probes(progress=lambda _u: None, steps=lambda _u: (None, None)),
    )


@pytest.mark.parametrize("code", [0, 1, 2, 4])
def test_a_final_exit_stays_final_when_the_container_is_started_again(tmp_path: Path, code: int) -> None:
    command = child(tmp_path, f"sys.exit({code})")
    assert stateful(tmp_path, command).run() == code
    assert stateful(tmp_path, command).run() == code  # Docker restarted the container: same code ...
    assert runs(tmp_path) == 1  # ... and the task never ran again


def test_a_killed_container_spends_the_budget_that_survives_it(tmp_path: Path) -> None:
    # Run 1 of each container is killed with it (the container dies mid-run); the state says it ran.
    command = child(tmp_path, "sys.exit(0 if run >= 2 else 137)")
    first = stateful(tmp_path, command)
    first.state.runs = 1  # what a container killed during its first run leaves behind
    first._save()
    again = stateful(tmp_path, command)
    assert again.run() == 0
    assert again.budget.used == 2  # the container's restart and one of the trainer's: the budget went on
    assert runs(tmp_path) == 2


def test_a_container_restarted_without_budget_gives_up_for_good(tmp_path: Path) -> None:
    command = child(tmp_path, "sys.exit(137)")
    assert stateful(tmp_path, command).run() == EXIT_GAVE_UP
    assert runs(tmp_path) == 3
    assert stateful(tmp_path, command).run() == EXIT_GAVE_UP
    assert runs(tmp_path) == 3


def test_a_final_exit_is_announced_on_the_cluster_port_with_the_tasks_reason(tmp_path: Path) -> None:
    port = free_port()
    reason = "configuration error: TRAINER_SEED='x': must be an integer"
    command = child(
        tmp_path, f"Path(os.environ['SUPERVISE_REASON_FILE']).write_text({reason!r}); sys.exit(2)"
    )
    sup = stateful(tmp_path, command, notice_port=port, peers=1, notice_seconds=30)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(sup.run()))
    thread.start()
    deadline, said = time.time() + 30, ""
    while not said.startswith("failed") and time.time() < deadline:
        said = preflight.probe(f"127.0.0.1:{port}")
        time.sleep(0.05)
    thread.join(timeout=10)
    assert said == f"failed for good: exit 2 (bad configuration: {reason})"
    assert result == [2]  # told its one peer, so it did not wait out the 30 s
    assert sup.state.why == reason


def test_a_stuck_step_gets_every_threads_stack_written_and_the_trainer_restarted(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    # The step advances twice, then the input blocks for ever (first run); the second run finishes.
    body = f"""\
        import faulthandler, threading
        faulthandler.register(signal.{supervise.DUMP_SIGNAL.name}, all_threads=True)
        if run >= 2:
            sys.exit(0)
        def blocked_input():
            threading.Event().wait()
        def heartbeat():  # another thread: every one is written
            while True:
                time.sleep(0.1)
        threading.Thread(target=heartbeat, daemon=True).start()
        for step in (1, 2):
            Path({str(tmp_path / "global")!r}).write_text(str(step))
            time.sleep(0.3)
        blocked_input()
        """
    lines: list[str] = []
    settings = supervise.Settings(
        command=child(tmp_path, body),
        max_restarts=1,
        restart_delay=0.01,
        poll=0.05,
        stall=stall.StallBound(multiple=20, floor=1.0, ceiling=2.0),
    )

    def steps(_url: str) -> tuple[int | None, float | None]:
        found = tmp_path / "global"
        return (int(found.read_text()) if found.exists() else None), 0.01  # p99 10 ms: the floor rules

    sup = supervise.Supervisor(
        settings, log=lines.append, probes=supervise.Probes(progress=lambda _u: None, steps=steps)
    )
    assert sup.run() == 0
    assert runs(tmp_path) == 2
    stuck = [ln for ln in lines if ln.startswith("stuck: step stuck at 2 for ")]
    assert stuck and "(bound 1s: 20 x p99 step 0.01s, floor 1s, ceiling 2s); no task is behind" in stuck[0], (
        lines
    )
    assert any(ln.startswith("exited 137 (killed by SIGKILL) (step stuck at 2") for ln in lines), lines
    dump = capfd.readouterr().err
    assert "in blocked_input" in dump and "in heartbeat" in dump, dump[-2000:]


@pytest.mark.parametrize(
    ("text", "bound"),
    [
        ("20,60,900", stall.StallBound(20, 60, 900)),
        ("0", None),
        ("5,1,10", stall.StallBound(5, 1, 10)),
    ],
)
def test_stall_bound_from_the_environment(text: str, bound: stall.StallBound | None) -> None:
    assert stall.StallBound.parse(text) == bound


def test_stall_bound_is_a_multiple_of_the_p99_step_within_floor_and_ceiling() -> None:
    bound = stall.StallBound(20, 60, 900)
    assert [bound.seconds(p) for p in (0.05, 4.0, 100.0, None)] == [60, 80, 900, 900]
    assert probe.p99([(0.01, 50), (0.1, 99), (1.0, 100), (float("inf"), 100)]) == 0.1
    assert probe.p99([(0.01, 0), (float("inf"), 0)]) is None


@pytest.mark.parametrize(
    ("inputs", "late"),
    [
        ({"chief": 41, "worker-0": 41, "worker-1": 40}, ("worker-1",)),  # input blocked on 41
        ({"chief": 40, "worker-0": 41, "worker-1": 41}, ("chief",)),  # never entered the next call
        ({"chief": 41, "worker-0": 41, "worker-1": 41}, ()),  # all in the collective: nobody singled out
        ({"chief": 41, "worker-0": None, "worker-1": 40}, ("worker-1",)),  # an unreadable peer is ignored
        ({"chief": 41, "worker-0": None}, ()),
    ],
)
def test_the_task_behind_is_the_one_whose_input_step_is_lowest(inputs: dict, late: tuple) -> None:
    assert stall.behind(inputs) == late


def stuck_supervisor(tmp_path: Path, task: str, inputs: dict[str, int]) -> tuple[supervise.Supervisor, list]:
    """A 3-task job stuck at step 2 (a child that blocks after two steps), seen by `task`'s supervisor."""
    body = f"""\
        if run >= 2:
            sys.exit(0)
        for step in (1, 2):
            Path({str(tmp_path / "global")!r}).write_text(str(step))
            time.sleep(0.3)
        time.sleep(3600)
        """
    peers = [t for t in ("chief", "worker-0", "worker-1") if t != task]
    settings = supervise.Settings(
        command=child(tmp_path, body),
        max_restarts=1,
        restart_delay=0.01,
        poll=0.05,
        stall=stall.StallBound(multiple=20, floor=1.0, ceiling=2.0),
        state_file=str(tmp_path / "state.json"),
        metrics_url="own",
        task=task,
        peer_metrics=tuple((p, p) for p in peers),
    )

    def steps(_url: str) -> tuple[int | None, float | None]:
        found = tmp_path / "global"
        return (int(found.read_text()) if found.exists() else None), 0.01

    lines: list[str] = []
    sup = supervise.Supervisor(
        settings,
        log=lines.append,
        probes=supervise.Probes(
            progress=lambda _u: None,
            steps=steps,
            inputs=lambda url: inputs[task if url == "own" else url],
            wall=lambda: 1234.5,
        ),
    )
    return sup, lines


def test_the_supervisor_of_the_task_behind_names_it_and_ends_it(tmp_path: Path) -> None:
    inputs = {"chief": 3, "worker-0": 3, "worker-1": 2}
    sup, lines = stuck_supervisor(tmp_path, "worker-1", inputs)
    started = time.monotonic()
    assert sup.run() == 0
    stuck = [ln for ln in lines if ln.startswith("stuck: ")]
    assert stuck and "worker-1 is behind its peers, not in the collective (input steps: " in stuck[0], lines
    assert "worker-1 2, chief 3, worker-0 3" in stuck[0]
    assert time.monotonic() - started < 2 * 2.0 + 10  # within the bound, not the peers' second one
    assert budget.State.load(str(tmp_path / "state.json")).stuck == "2 1234.500"


def test_a_supervisor_whose_task_is_not_behind_waits_one_more_bound_then_ends_it(tmp_path: Path) -> None:
    inputs = {"chief": 3, "worker-0": 3, "worker-1": 2}
    sup, lines = stuck_supervisor(tmp_path, "chief", inputs)  # worker-1's supervisor never acts here
    assert sup.run() == 0
    deferred = [ln for ln in lines if "worker-1 behind (input steps: chief 3, worker-0 3, worker-1 2)" in ln]
    assert deferred and deferred[0].endswith(": its supervisor ends it"), lines
    ended = [ln for ln in lines if ln.startswith("stuck: ")]
    assert ended and "worker-1 behind, still frozen 2s later: ending this task too" in ended[0], lines
    assert lines.index(deferred[0]) < lines.index(ended[0])


def test_a_peer_not_answering_is_being_ended_by_its_own_supervisor(tmp_path: Path) -> None:
    # worker-1's supervisor has already killed it: its metrics are gone, the others are equal.
    inputs = {"chief": 3, "worker-0": 3, "worker-1": None}
    sup, lines = stuck_supervisor(tmp_path, "chief", inputs)
    assert sup.run() == 0
    assert any(
        ln.endswith(
            "worker-1 not answering (input steps: chief 3, worker-0 3, worker-1 ?): its supervisor ends it"
        )
        for ln in lines
    ), lines


def test_the_next_run_is_told_where_its_task_was_stuck(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    body = f"""\
        Path({str(seen)!r}).write_text(os.environ.get("SUPERVISE_STUCK", "-"))
        sys.exit(0)
        """
    state = tmp_path / "state.json"
    budget.State(stuck="40 1234.500").save(str(state))
    settings = supervise.Settings(command=child(tmp_path, body), state_file=str(state), poll=0.05)
    supervise.Supervisor(
        settings, log=lambda _m: None, probes=supervise.Probes(progress=lambda _u: None)
    ).run()
    assert seen.read_text() == "40 1234.500"


def test_peers_metrics_are_read_on_the_same_port_at_their_tf_config_hosts() -> None:
    from trainer.cluster.spec import from_template

    spec = from_template(2, "{service}:{port}")
    tf_config = spec.with_task(TaskId("worker", 1)).to_tf_config()
    s = supervise_settings.settings_from(
        ["--", "true"], {"TF_CONFIG": tf_config, "TRAINER_METRICS_PORT": "8000"}
    )
    assert s.task == "worker-1"
    assert dict(s.peer_metrics) == {
        "chief": "http://chief:8000/metrics",
        "worker-0": "http://worker-0:8000/metrics",
    }


def test_reads_the_input_step_from_an_exposition() -> None:
    import http.server

    text = b'trainer_input_step{task_type="worker",task_index="1"} 41.0\n'

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *_args) -> None: ...

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert probe.input_step(f"http://127.0.0.1:{server.server_port}/metrics") == 41
    finally:
        server.shutdown()
    assert probe.input_step("") is None
