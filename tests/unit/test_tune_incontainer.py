"""monitoring/tune/incontainer.py: the trial clusters where the job runs. The engine is compose/engine.py's
`Engine` with a fake `run` (nothing reaches Docker); /proc is a folder the test writes; signals are
recorded, not sent."""

from __future__ import annotations

import json
import math
import signal
import subprocess

import contract as c
from compose.engine import Engine
from monitoring.tune import incontainer, reference

JOB_TF_CONFIG = (
    '{"cluster":{"chief":["chief:2222"],"worker":["worker-0:2222"]},"task":{"index":0,"type":"chief"}}'
)


def _inspect(cid: str, name: str, chief: bool) -> dict:
    """`docker inspect` of a task as compose starts it (tests/golden/cpu-workers-1.compose.tasks.yaml),
    with the limits a team may add."""
    mounts = [
        {"Type": "volume", "Name": "p_supervise", "Destination": "/var/lib/supervise", "RW": True},
        {"Type": "bind", "Source": "/home/team/job", "Destination": "/script", "RW": False},
    ]
    if chief:
        mounts.append({"Type": "volume", "Name": "p_checkpoints", "Destination": "/checkpoints", "RW": True})
    tmpfs = {"/tmp": ""} if chief else {"/tmp": "", "/checkpoints": "uid=1000,gid=1000"}
    return {
        "Id": cid,
        "Config": {
            "Image": "mwms/trainer:0.1.0-cpu",
            "User": "1000:1000",
            "Cmd": ["python", "-m", "trainer.supervise.supervisor", "--", "python", "-m", "trainer"],
            "Env": [
                f"TF_CONFIG={JOB_TF_CONFIG}",
                "TRAINER_TASK=cnn",
                "TRAINER_CHECKPOINT_DIR=/checkpoints",
                "SUPERVISE_MAX_RESTARTS=3",
                "PATH=/usr/bin",
            ],
        },
        "HostConfig": {
            "NanoCpus": 1500000000,
            "Memory": 2147483648,
            "CpusetCpus": "0",
            "PidsLimit": None,
            "ReadonlyRootfs": True,
            "Init": True,
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges:true"],
            "Tmpfs": tmpfs,
            "Devices": [
                {"PathOnHost": "/dev/fuse", "PathInContainer": "/dev/fuse", "CgroupPermissions": "rwm"}
            ],
        },
        "Mounts": mounts,
        "NetworkSettings": {"Networks": {"p_cluster": {"IPAddress": f"172.30.0.{2 + (not chief)}"}}},
    }


class FakeDocker:
    """`run` for Engine: `inspect ID` answers _inspect, `run -d` a new id, `inspect --format` a pid;
    `ps`/`volume ls` answer `listed`; every call recorded."""

    def __init__(self, pids=(101, 202), listed="", state=None) -> None:
        self.calls, self.pids, self.listed, self.started = [], list(pids), listed, 0
        self.state = state or {}

    def __call__(self, cmd, **kw):
        args, out = cmd[1:], ""
        self.calls.append(args)
        if args[:2] == ["run", "-d"]:
            self.started += 1
            out = f"trial{self.started}\n"
        elif args[:2] == ["inspect", "--format"] and "State.Pid" in args[2]:
            out = f"{self.pids.pop(0)}\n"
        elif args[:2] == ["inspect", "--format"]:
            out = json.dumps(self.state)
        elif args[0] == "inspect":
            out = json.dumps(
                [_inspect(args[1], "chief" if args[1] == "job-c" else "worker-0", args[1] == "job-c")]
            )
        elif args[0] in ("ps", "volume") and args[1] in ("-aq", "ls"):
            out = self.listed
        elif args[0] == "logs":
            return subprocess.CompletedProcess(cmd, 0, "step 10\n", "E ResourceExhausted: out of memory\n")
        return subprocess.CompletedProcess(cmd, 0, out, "")


def _tasks(docker: FakeDocker):
    return incontainer.tasks({"chief": "job-c", "worker-0": "job-w0"}, Engine(run=docker))


def test_a_trial_task_has_its_tasks_limits_user_devices_and_binds_not_its_volumes():
    chief, worker = _tasks(FakeDocker())
    assert chief.command == ("python", "-m", "trainer")  # the supervisor's child: a trial never restarts
    assert chief.checkpoint == "p_checkpoints" and worker.checkpoint == ""
    assert "TF_CONFIG" not in chief.env and "SUPERVISE_MAX_RESTARTS" not in chief.env
    assert chief.env["TRAINER_TASK"] == "cnn" and chief.address == "172.30.0.2"
    o = " ".join(chief.options)
    for flag in ("--cpus 1.5", "--memory 2147483648", "--cpuset-cpus 0", "--read-only", "--cap-drop ALL",
                 "--security-opt no-new-privileges:true", "--tmpfs /tmp", "--device /dev/fuse:/dev/fuse:rwm",
                 "--user 1000:1000", "--mount type=bind,source=/home/team/job,target=/script,readonly"):  # fmt: skip
        assert flag in o, flag
    assert "supervise" not in o and "p_checkpoints" not in o  # the job's volumes stay the job's
    assert "--tmpfs /checkpoints:uid=1000,gid=1000" in " ".join(worker.options)


def test_a_trial_container_joins_its_tasks_namespace_on_ports_of_its_cluster_own():
    docker = FakeDocker()
    tasks = _tasks(docker)
    cl = incontainer.Cluster("BYTES_PER_PACK=4096", 2, tasks, {"BYTES_PER_PACK": "4096"}, "p_tune2", "p",
                             Engine(run=docker))  # fmt: skip
    chief, worker = cl.run_argv(0), cl.run_argv(1)
    assert chief[chief.index("--network") + 1] == "container:job-c"
    assert worker[worker.index("--network") + 1] == "container:job-w0"
    assert f"{incontainer.LABEL}=p" in chief and "--init" in chief
    assert "type=volume,source=p_tune2,target=/checkpoints" in chief
    assert not any("p_tune2" in a for a in worker)  # a worker keeps its tmpfs, as in the job
    env = dict(worker[i + 1].split("=", 1) for i, a in enumerate(worker) if a == "-e")
    tf = json.loads(env["TF_CONFIG"])
    port = incontainer.TF_PORT + 2
    assert tf == {"cluster": {"chief": [f"chief:{port}"], "worker": [f"worker-0:{port}"]},
                  "task": {"type": "worker", "index": 0}}  # fmt: skip
    assert env["TRAINER_METRICS_PORT"] == str(incontainer.METRICS_PORT + 2)
    assert {port, incontainer.METRICS_PORT + 2}.isdisjoint({c.TF_PORT, c.METRICS_PORT, c.PROFILER_PORT})
    assert env["TRAINER_BYTES_PER_PACK"] == "4096" and env["TRAINER_SAVE_EVERY"] == "0"
    assert chief[-4:] == ["mwms/trainer:0.1.0-cpu", "python", "-m", "trainer"]


def _proc(tmp_path, tree: dict[int, int]):
    """A /proc with a `stat` for each pid of `tree` (pid -> its parent's pid)."""
    for pid, parent in tree.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (python3 -m x) S {parent} 2 3")
    return tmp_path


def test_turns_signal_the_trial_processes_under_each_init_and_a_dead_one_says_why(tmp_path):
    proc = _proc(tmp_path, {1: 0, 101: 50, 111: 101, 202: 50, 222: 202, 223: 222, 300: 1})
    docker, sent = FakeDocker(state={"Status": "exited", "ExitCode": 137}), []
    cl = incontainer.Cluster("current", 0, _tasks(docker), {}, "p_tune0", "p", Engine(run=docker), proc,
                             kill=lambda pid, sig: sent.append((pid, sig)))  # fmt: skip
    cl.start()
    assert cl.containers == ["trial1", "trial2"] and cl.pids == [101, 202] and cl.failed() == ""
    cl.signal(signal.SIGSTOP)
    assert sorted(sent) == [(111, signal.SIGSTOP), (222, signal.SIGSTOP), (223, signal.SIGSTOP)]  # not init
    (proc / "202" / "stat").write_text("202 (docker-init) Z 1 2 3")
    why = cl.failed().splitlines()
    assert why[0] == "its worker-0 exited 137 (E ResourceExhausted: out of memory)", why
    cl.stop()
    assert docker.calls[-1] == ["rm", "-f", "trial1", "trial2"]


def test_a_cluster_the_engine_refuses_fails_alone():
    class Refusing(FakeDocker):
        def __call__(self, cmd, **kw):
            if cmd[1:3] == ["run", "-d"]:
                return subprocess.CompletedProcess(cmd, 125, "", "docker: Error response: no such image")
            return super().__call__(cmd, **kw)

    docker = Refusing()
    cl = incontainer.Cluster("x", 1, _tasks(docker), {}, "v", "p", Engine(run=docker))
    cl.start()
    assert cl.failed().startswith("its containers did not start (docker run -d: ")


def test_checkpoint_copies_and_leftovers_go_through_the_label():
    docker = FakeDocker(listed="a1\nb2\n")
    names = incontainer.copies(_tasks(docker), 3, "p", Engine(run=docker))
    assert names == ["p_tune0", "p_tune1", "p_tune2"]
    creates = [c for c in docker.calls if c[:2] == ["volume", "create"]]
    assert len(creates) == 3 and all(f"{incontainer.LABEL}=p" in c for c in creates)
    (copy,) = [c for c in docker.calls if c[:2] == ["run", "--rm"]]
    assert (
        "p_checkpoints:/from:ro" in copy and "p_tune2:/to/2" in copy and copy[copy.index("--user") + 1] == "0"
    )
    docker.calls.clear()
    assert incontainer.remove("p", Engine(run=docker)) == 4
    assert ["rm", "-f", "a1", "b2"] in docker.calls and ["volume", "rm", "-f", "a1", "b2"] in docker.calls
    assert all(
        f"label={incontainer.LABEL}=p" in c
        for c in docker.calls
        if c[0] in ("ps",) or c[:2] == ["volume", "ls"]
    )


def test_the_table_says_how_close_the_current_trial_came_to_the_jobs_split():
    job = reference.Split(step_ms=64.0, allreduce=0.80, low=0.79, high=0.83)
    assert job.line(61.0, 0.80).endswith(
        "the current settings' trial 61.0 ms = 80 % all-reduce: inside the job's range"
    )
    assert "the job's chief over its last 3m: 64.0 ms = 80 % all-reduce (79-83 %)" in job.line(61.0, 0.8)
    assert job.line(26.5, 0.26).endswith("53 points outside the job's range")
    assert job.line(0, math.nan).endswith("not measured")
    assert reference.trial_share({"step": 50.0, "all-reduce": 40.0}) == 0.8


def test_the_jobs_split_is_its_chiefs_medians_and_a_restarting_job_has_none():
    """Medians from the job's histograms, as the trial's row: a minute without steps (NaN) is left out of
    the range, and a job with no step in the lookback has no reference (the tune says so)."""

    class Prom:
        def __init__(self, answers):
            self.answers = answers

        def query(self, expr):
            minute = (
                int(expr.split(" offset ")[1][0]) if " offset " in expr else (-1 if "[3m]" in expr else 0)
            )
            part = "step" if c.STEP.name in expr else "all-reduce"
            value = self.answers.get((part, minute), math.nan)
            chief, worker = (
                {"task_type": "chief", "task_index": "0"},
                {"task_type": "worker", "task_index": "0"},
            )
            return [{"metric": worker, "value": [0, "9"]}, {"metric": chief, "value": [0, str(value)]}]

    answers = {("step", -1): 0.064, ("all-reduce", -1): 0.051, ("step", 0): 0.064, ("all-reduce", 0): 0.0512,
               ("step", 1): 0.063, ("all-reduce", 1): 0.0441}  # fmt: skip
    split = reference.job_split(Prom(answers), '{project="p"}')
    assert split.step_ms == 64.0 and split.allreduce == 0.051 / 0.064
    assert (split.low, split.high) == (0.0441 / 0.063, 0.0512 / 0.064)  # minute 2 had no step: left out
    assert reference.job_split(Prom({}), '{project="p"}') is None
