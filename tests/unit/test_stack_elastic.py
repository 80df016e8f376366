"""A Swarm job that changes size: the pinned bundle (compose/targets/swarm.py --trainer-nodes), what
`make stack-resize` records, refuses and places (compose/stackresize.py), and what `make stack-elastic`
decides from Swarm's state (compose/elastic.py). The Swarm itself: tests/e2e/test_swarm.py."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from compose import elastic, emit, knobs, stackresize, swarmstate
from compose.elastic import Seen
from compose.swarmstate import Task
from contract import elastic as defaults

IMAGE = "10.210.0.10:5000/mwms/trainer@sha256:" + "0" * 64
NODES = ("node-2", "node-3", "node-1")


def _argv(out: Path, workers: int = 2, *extra: str) -> list[str]:
    return ["--target", "swarm", "--workers", str(workers), "--image", IMAGE, "--out", str(out), "--project", "s", *extra]  # fmt: skip


def _stack(out: Path) -> dict:
    return yaml.safe_load((out / "stack.yaml").read_text())["services"]


def test_trainer_nodes_pin_one_task_per_node_in_order(tmp_path: Path) -> None:
    emit.write(emit.run(_argv(tmp_path, 2, "--trainer-nodes", ",".join(NODES))))
    pinned = {
        name: s["deploy"]["placement"]["constraints"]
        for name, s in _stack(tmp_path).items()
        if name in ("chief", "worker-0", "worker-1")
    }
    assert pinned == {
        "chief": ["node.labels.org.mwms.node == node-2"],
        "worker-0": ["node.labels.org.mwms.node == node-3"],
        "worker-1": ["node.labels.org.mwms.node == node-1"],
    }
    assert "one task per node, pinned in TRAINER_NODES order" in (tmp_path / "translation.txt").read_text()


def test_unpinned_by_default(tmp_path: Path) -> None:
    emit.write(emit.run(_argv(tmp_path)))
    assert "placement" not in _stack(tmp_path)["chief"]["deploy"]


@pytest.mark.parametrize(
    "nodes, said",
    [
        ("node-1,node-2", "TRAINER_NODES=node-1,node-2: 2 nodes for a chief + 2 workers, one task per node"),
        ("node-1,node-1,node-2", "TRAINER_NODES='node-1,node-1,node-2': distinct node names"),
        ("node 1,node-2,node-3", "TRAINER_NODES='node 1,node-2,node-3': distinct node names"),
    ],
)
def test_bad_trainer_nodes_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, nodes: str, said: str
) -> None:
    assert emit.main(_argv(tmp_path, 2, "--trainer-nodes", nodes)) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and "\n" not in err, err


def _recorded(out: Path, *extra: str, environ: dict | None = None) -> dict:
    argv = _argv(out, 2, *extra)[2:]  # what stack-up.sh passes: the emitter's flags after --target swarm
    argv = ["--target", "swarm", *argv]
    emit.write(emit.run(argv, environ or {}))
    stackresize.record(out, argv, {"SWARM_NAME": "sw", "NODES": "3", **(environ or {})})
    return stackresize.load(out)


def test_the_record_keeps_the_flags_the_knobs_and_the_run(tmp_path: Path) -> None:
    env = {**knobs.on_command_line(STEPS="600", SAVE_EVERY="50"), "TRAINER_SEED": "3", "HOME": "/root"}
    rec = _recorded(tmp_path, "--trainer-nodes", ",".join(NODES), environ=env)
    assert rec["environ"] == {"STEPS": "600", "SAVE_EVERY": "50", "MAKE_COMMAND_LINE": "STEPS SAVE_EVERY", "TRAINER_SEED": "3"}  # fmt: skip
    assert rec["swarm"] == "sw" and rec["nodes"] == 3
    assert rec["run"] and f'hostname: "chief-{rec["run"]}"' in (tmp_path / "stack.yaml").read_text()


def test_a_bundle_emitted_again_at_another_size_keeps_the_knobs_and_takes_a_new_run(tmp_path: Path) -> None:
    rec = _recorded(tmp_path, "--trainer-nodes", ",".join(NODES), environ=knobs.on_command_line(STEPS="600"))
    run = stackresize.emit_bundle(
        tmp_path, {**rec, "argv": [a for a in rec["argv"]]}, 1, ["node-3", "node-1"]
    )
    services = _stack(tmp_path)
    assert "worker-1" not in services and run != "" and services["chief"]["hostname"] == f"chief-{run}"
    tf = json.loads(services["worker-0"]["environment"]["TF_CONFIG"])
    assert tf["cluster"] == {"chief": ["chief:2222"], "worker": ["worker-0:2222"]}
    assert services["worker-0"]["environment"]["TRAINER_STEPS"] == "600"
    assert services["chief"]["deploy"]["placement"]["constraints"] == ["node.labels.org.mwms.node == node-3"]


def test_no_record_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(stackresize.Refused, match="make stack-up STACK="):
        stackresize.load(tmp_path)


def test_stack_resize_knobs_given_now_overlay_the_recorded_ones() -> None:
    recorded = {"STEPS": "600", "MAKE_COMMAND_LINE": "STEPS"}
    now = {"WORKERS": "1", "STEPS": "900", "RESIZE_KEEP": "global-batch", "MAKE_COMMAND_LINE": "WORKERS STEPS RESIZE_KEEP"}  # fmt: skip
    got = stackresize.overlay(recorded, now)
    assert got == {"STEPS": "900", "RESIZE_KEEP": "global-batch", "MAKE_COMMAND_LINE": "RESIZE_KEEP STEPS"}


def _task(name: str, state: str = "running", since: float = 0.0, error: str = "") -> Task:
    """`since`: when Swarm made the task; its state's stamp is always now, as Swarm's scheduler stamps a
    Pending task at every attempt."""
    return Task(name=name, state=state, since=1e12, created=since, node="", error=error, desired="running")


def _tasks(*tasks: Task) -> dict[str, Task]:
    return {t.name: t for t in tasks}


FULL = _tasks(_task("chief"), _task("worker-0"), _task("worker-1"))


@pytest.mark.parametrize("workers", ["-1", "two", "1.5", ""])
def test_stack_resize_refuses_a_count_that_is_not_a_whole_number(workers: str) -> None:
    assert stackresize.refusal(workers, "s", FULL).startswith(f"WORKERS={workers!r}: a whole number")


def test_stack_resize_refuses_the_same_size_no_stack_and_a_finished_job() -> None:
    assert stackresize.refusal("2", "s", FULL) == "STACK=s already trains with WORKERS=2: nothing to resize"
    assert "make stack-up STACK=s WORKERS=N" in stackresize.refusal("1", "s", {})
    done = {**FULL, "chief": _task("chief", "complete")}
    assert "has finished" in stackresize.refusal("1", "s", done)
    assert stackresize.refusal("1", "s", FULL) is None and stackresize.refusal("3", "s", FULL) is None


def test_placement_takes_the_first_ready_nodes_in_order_and_refuses_too_few() -> None:
    rec = {"argv": ["--trainer-nodes", ",".join(NODES)]}
    assert stackresize.placement(rec, 1, {"node-1", "node-3"}) == ["node-3", "node-1"]
    with pytest.raises(stackresize.Refused, match=r"WORKERS=2 needs 3 ready nodes .* ready: node-1,node-3"):
        stackresize.placement(rec, 2, {"node-1", "node-3"})
    assert stackresize.placement({"argv": []}, 5, set()) == []


def _seen(tasks: dict[str, Task], ready: set[str], full: int = 2, now: float = 100.0, pinned=NODES) -> Seen:
    return Seen(full=full, tasks=tasks, pinned=list(pinned), ready=frozenset(ready), now=now)


ALL = {"node-1", "node-2", "node-3"}
AFTER = 60.0


def test_at_full_size_it_watches() -> None:
    d = elastic.decide(_seen(FULL, ALL), 1, AFTER)
    assert (d.action, d.workers) == ("wait", 2) and "at full size" in d.why


def test_a_lost_nodes_task_unplaced_waits_resize_after_then_goes_on_with_fewer() -> None:
    lost = {**FULL, "chief": _task("chief", "pending", since=70.0, error="no suitable node")}
    early = elastic.decide(_seen(lost, {"node-1", "node-3"}), 1, AFTER)
    assert early.action == "wait" and "chief unplaced for 30 s (no suitable node)" in early.why
    assert "going on with WORKERS=1 at 60 s" in early.why
    late = elastic.decide(_seen(lost, {"node-1", "node-3"}, now=131.0), 1, AFTER)
    assert (late.action, late.workers) == ("resize", 1)


def test_never_fewer_than_min_workers() -> None:
    lost = {**FULL, "worker-1": _task("worker-1", "pending", since=0.0)}
    d = elastic.decide(_seen(lost, {"node-1", "node-3"}, now=1000.0), 2, AFTER)
    assert d.action == "wait" and "1 workers could run, MIN_WORKERS=2: waiting for a node" in d.why


def test_a_node_marked_down_before_its_task_is_replaced_is_waited_for() -> None:
    d = elastic.decide(_seen(FULL, {"node-1", "node-3"}), 1, AFTER)
    assert d.action == "wait" and "waiting for Swarm to mark the lost node's task" in d.why


def test_a_spare_node_takes_the_task_at_the_same_size() -> None:
    lost = {**FULL, "worker-0": _task("worker-0", "pending", since=0.0)}
    d = elastic.decide(
        _seen(lost, {"node-1", "node-3", "node-4"}, pinned=(*NODES, "node-4"), now=100.0), 1, AFTER
    )
    assert (d.action, d.workers) == ("resize", 2)


def test_grows_back_when_its_nodes_are_ready_and_every_task_runs() -> None:
    small = _tasks(_task("chief"), _task("worker-0"))
    assert "waiting for a node of TRAINER_NODES (ready: node-3,node-1" in elastic.decide(_seen(small, {"node-1", "node-3"}), 1, AFTER).why  # fmt: skip
    d = elastic.decide(_seen(small, ALL), 1, AFTER)
    assert (d.action, d.workers) == ("resize", 2)
    starting = _tasks(_task("chief"), _task("worker-0", "preparing"))
    assert elastic.decide(_seen(starting, ALL), 1, AFTER).action == "wait"


def test_unpinned_drops_the_task_no_node_takes_and_does_not_grow_by_itself() -> None:
    lost = {**FULL, "worker-1": _task("worker-1", "pending", since=0.0, error="insufficient resources")}
    d = elastic.decide(_seen(lost, ALL, pinned=(), now=100.0), 1, AFTER)
    assert (d.action, d.workers) == ("resize", 1)
    small = _tasks(_task("chief"), _task("worker-0"))
    assert elastic.decide(_seen(small, ALL, pinned=()), 1, AFTER).action == "wait"


def test_a_finished_job_ends_the_controller() -> None:
    done = {**FULL, "chief": _task("chief", "complete")}
    assert elastic.decide(_seen(done, ALL), 1, AFTER).action == "done"


def test_a_removed_stack_ends_the_controller_instead_of_deploying_it_again() -> None:
    d = elastic.decide(_seen({}, ALL), 1, AFTER)
    assert d.action == "done" and "no trainer services" in d.why


def test_resize_after_is_the_measured_restart_with_a_floor_and_a_default() -> None:
    assert defaults.resize_after(None) == defaults.RESIZE_AFTER_UNMEASURED_S
    assert defaults.resize_after(1.0) == defaults.RESIZE_AFTER_FLOOR_S
    assert defaults.resize_after(95.0) == 95.0 * defaults.RESIZE_AFTER_RESTARTS


def test_swarm_times_and_nodes_are_read_as_swarm_words_them() -> None:
    assert swarmstate.stamp("2026-12-05T23:10:01.123456789Z") == pytest.approx(1796512201.123456)
    record = {"Spec": {"Labels": {"org.mwms.node": "node-2"}, "Availability": "active"},
              "Description": {"Hostname": "node-2"}, "Status": {"State": "down"}}  # fmt: skip
    node = swarmstate._node(record)
    assert (node.name, node.usable) == ("node-2", False)
    again = {**record, "Status": {"State": "ready"}}
    assert swarmstate.usable([node, swarmstate._node(again)]) == {"node-2"}


def test_a_bad_min_workers_is_one_line(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert elastic.main(["--dir", str(tmp_path), "--min-workers", "-1"]) == 2
    assert capsys.readouterr().err.strip() == "elastic: MIN_WORKERS and RESIZE_AFTER must be 0 or more"
    assert elastic.main(["--dir", str(tmp_path)]) == 2
    assert "make stack-up STACK=" in capsys.readouterr().err


def _manager(stdout: str = "", stderr: str = "", code: int = 0) -> swarmstate.Manager:
    """A manager whose `docker` answers as given (node 1 manages: the first question is `docker info`)."""

    def run(cmd, timeout=60):
        if cmd[-1] == "{{.Swarm.ControlAvailable}}":
            return subprocess.CompletedProcess(cmd, 0, "true\n", "")
        return subprocess.CompletedProcess(cmd, code, stdout, stderr)

    return swarmstate.Manager("sw", 3, run=run)


def test_the_chiefs_lines_are_read_from_stderr_and_despite_a_down_nodes_error() -> None:
    # The trainer logs to stderr; a Down node's old task makes `docker service logs` exit non-zero.
    log = (
        "2026-12-05T23:10:01.000000000Z chief: resized at step 150: 3 -> 2 replicas, global batch 96 -> 64\n"
        "2026-12-05T23:10:02.500000000Z chief: resumed at step 150 from /checkpoints/ckpt-150, 2 replicas in sync\n"
    )
    m = _manager(stderr=log + "error from daemon in stream: node is down\n", code=1)
    said, at = stackresize.started(m, "s", since=time.time() - 5, sleep=lambda s: None)
    assert said == "resized at step 150: 3 -> 2 replicas, global batch 96 -> 64"
    assert at == pytest.approx(swarmstate.stamp("2026-12-05T23:10:02.5Z"))


def test_a_chief_without_a_copy_of_its_own_is_said_by_its_start_line() -> None:
    m = _manager(stderr="2026-12-05T23:10:02Z chief: starting at step 200 (worker-0's), 3 replicas in sync\n")
    said, _ = stackresize.started(m, "s", since=time.time() - 5, sleep=lambda s: None)
    assert said == "starting at step 200 (worker-0's), 3 replicas in sync"


def test_tasks_are_matched_to_their_services_by_full_id() -> None:
    """`docker service ls` prints 12 characters of an id (20.10 has no --no-trunc there); a task's
    ServiceID is the full id (the first swarm run read no task at all, took the job for 0 workers and
    'grew' it in a loop)."""
    full = "k3x0p2mz1q9w8e7r6t5y4u3i2"
    task = {
        "ID": "t1", "ServiceID": full, "CreatedAt": "2026-12-05T23:50:00.0Z", "NodeID": "n1",
        "DesiredState": "running", "Status": {"State": "running", "Timestamp": "2026-12-05T23:50:01.0Z"},
    }  # fmt: skip
    node = {"ID": "n1", "Description": {"Hostname": "node-2"}}

    def run(cmd, timeout=60):
        args = cmd[4:]
        if cmd[-1] == "{{.Swarm.ControlAvailable}}":
            out = "true\n"
        elif args[:2] == ["service", "ls"]:
            out = f"{full[:12]} s_chief\n"
        elif args[:2] == ["stack", "ps"]:
            out = "t1\n"
        elif args[:2] == ["node", "ls"]:
            out = "n1\n"
        elif args[:2] == ["node", "inspect"]:
            out = json.dumps([node])
        else:
            out = json.dumps([task])
        return subprocess.CompletedProcess(cmd, 0, out, "")

    found = swarmstate.tasks(swarmstate.Manager("sw", 3, run=run), "s")
    assert list(found) == ["chief"] and found["chief"].node == "node-2" and found["chief"].state == "running"


def test_the_stop_waits_through_a_task_reaped_mid_question() -> None:
    """Swarm reaped a task between `stack ps` and `inspect` ("No such task"): the stop asks again
    instead of ending the resize with the job at 0 replicas (found by the swarm run)."""
    answers = iter([subprocess.CompletedProcess([], 1, "", "Error: No such task: m1f")])

    def run(cmd, timeout=60):
        args = cmd[4:]
        if cmd[-1] == "{{.Swarm.ControlAvailable}}":
            return subprocess.CompletedProcess(cmd, 0, "true\n", "")
        if args[:2] == ["service", "ls"]:
            return subprocess.CompletedProcess(cmd, 0, "abc s_chief\n", "")
        if args[:2] == ["stack", "ps"]:
            return subprocess.CompletedProcess(cmd, 0, "t1\n", "")
        if args[:2] == ["inspect", "--type"]:
            return next(answers, subprocess.CompletedProcess(cmd, 0, "[]", ""))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    stackresize.stop(
        swarmstate.Manager("sw", 3, run=run), "s", ["chief"], sleep=lambda s: None, follow=_read("")
    )


def _read(text: str):
    return lambda m, service, limit: lambda: text


def test_the_stop_says_the_step_every_task_saved_from_the_chiefs_log() -> None:
    """Swarm removes a scaled-down task's container and its log: the chief's is read while it stops."""

    def run(cmd, timeout=60):
        if cmd[-1] == "{{.Swarm.ControlAvailable}}":
            return subprocess.CompletedProcess(cmd, 0, "true\n", "")
        return subprocess.CompletedProcess(cmd, 0, "", "")  # no trainer left: stopped

    m = swarmstate.Manager("sw", 3, run=run)
    line = "chief: preempted (SIGTERM here or on a peer): every task saved step 392; restart every task\n"
    assert stackresize.stop(m, "s", ["chief"], sleep=lambda s: None, follow=_read(line)) == 392
    assert stackresize.stop(m, "s", ["chief"], sleep=lambda s: None, follow=_read("")) is None
