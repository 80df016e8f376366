"""The trial clusters where the job runs (docs/tune.md, "Where the trials run"). For each setting, one
trial container per task of the job, started in that task's own container's network namespace
(`docker run --network container:<task>`: the task's IP, its eth0 with any shaping on it, its peers'
names), of the task's image, with the task's CPU, memory, device, user, read-only and bind-mount
settings, on a TensorFlow and a metrics port of the cluster's own. Nothing listens on a host address:
the host reads a trial chief's /metrics at the chief task's address on the job's network.

Turns are SIGSTOP/SIGCONT of the trial's processes from the host (the children of each container's
init, by their host pids): as cheap as a local process's, and never "unable to freeze" as `docker pause`
is on a loaded machine. Every container and volume made here carries LABEL=<project>: a tune killed with
SIGKILL leaves them behind, and the next tune removes them first. Host side; every docker call goes
through the engine adapter (compose/engine.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import contract as c
from compose import deployment
from compose.engine import Engine, EngineError
from monitoring.tune import scrape, trial
from monitoring.tune.candidates import PROCESS_VARIABLES
from trainer.host import ENV_PREFIX

LABEL = "org.mwms.tune"
"""On every trial container and volume, valued with the project: what a later tune removes."""
TF_PORT = c.TF_PORT + 100
"""Cluster i's TensorFlow port is TF_PORT + i: in each task's namespace beside the job's own (paused)."""
METRICS_PORT = c.METRICS_PORT + 100
"""Cluster i's metrics port is METRICS_PORT + i."""
SUPERVISOR = "trainer.supervise.supervisor"
TRIAL_ENV = {
    ENV_PREFIX + "STEPS": "1000000000",  # the turns end it, never its step count
    ENV_PREFIX + "SAVE_EVERY": "0",
    ENV_PREFIX + "RESUME_NEW_SETTINGS": "1",
    ENV_PREFIX + "HEARTBEAT_TIMEOUT": "3600",  # a cluster waits whole seconds for its next turn
    ENV_PREFIX + "METRICS_LINGER": "0",
    ENV_PREFIX + "LOGDIR": "",
    ENV_PREFIX + "EXPORT_DIR": "",
    ENV_PREFIX + "OUTPUT_DIR": "",
    ENV_PREFIX + "PROFILER_PORT": "0",
    ENV_PREFIX + "FAULT": "",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "PYTHONUNBUFFERED": "1",
}
"""What every trial task runs with on top of its task's own environment: nothing of the job's written."""
ERROR = re.compile(r"error|killed|out of memory|exited with", re.IGNORECASE)
"""A line of a failed trial container's output that says why (its last such line is quoted)."""


class InContainerError(RuntimeError):
    """The job's containers cannot host trials (one line)."""


@dataclass(frozen=True)
class Task:
    """One task of the job, as its trial containers reproduce it (read from `docker inspect`)."""

    name: str
    container: str
    """The job's container: its network namespace is the trial's."""
    image: str
    options: tuple[str, ...]
    """`docker run` flags for its limits, devices, user, read-only root, tmpfs and bind mounts."""
    command: tuple[str, ...]
    """What its supervisor runs (`python -m trainer`, or the SCRIPT= wrapper and its script)."""
    env: dict[str, str]
    address: str
    """Its IP on the job's network: where the host reads its trial's /metrics."""
    checkpoint: str
    """The checkpoint volume it mounts at deployment.CHECKPOINT_DIR ("" for none: a worker's tmpfs)."""


def task(name: str, info: Mapping) -> Task:
    """The task of `docker inspect` output `info`. Pure."""
    cfg = info["Config"]
    env = dict(e.partition("=")[::2] for e in cfg.get("Env") or [])
    env = {k: v for k, v in env.items() if k != "TF_CONFIG" and not k.startswith("SUPERVISE_")}
    nets = (info.get("NetworkSettings") or {}).get("Networks") or {}
    address = next((n["IPAddress"] for n in nets.values() if n.get("IPAddress")), "")
    volumes = [m for m in info.get("Mounts") or [] if m.get("Type") == "volume"]
    ckpt = next((m["Name"] for m in volumes if m["Destination"] == deployment.CHECKPOINT_DIR), "")
    return Task(name, info["Id"], cfg["Image"], tuple(options(info)), command(cfg.get("Cmd") or []),
                env, address, ckpt)  # fmt: skip


def command(cmd: list[str]) -> tuple[str, ...]:
    """The trainer's own command: what follows the supervisor's `--` (the trial has no supervisor: a
    trial that fails is left out, never restarted)."""
    if SUPERVISOR in cmd and "--" in cmd:
        return tuple(cmd[cmd.index("--") + 1 :])
    return tuple(cmd)


def options(info: Mapping) -> list[str]:
    """`docker run` flags that give a trial container the task's CPU, memory, pids, shm, devices, user,
    capabilities, security options, read-only root, tmpfs and bind mounts. Its named volumes are not
    shared (a trial writes nothing of the job's); its checkpoint volume is the cluster's copy."""
    h, out = info.get("HostConfig") or {}, []
    flags = {"NanoCpus": "--cpus", "CpuQuota": "--cpu-quota", "CpuPeriod": "--cpu-period",
             "CpuShares": "--cpu-shares", "CpusetCpus": "--cpuset-cpus", "CpusetMems": "--cpuset-mems",
             "Memory": "--memory", "MemorySwap": "--memory-swap", "MemoryReservation": "--memory-reservation",
             "PidsLimit": "--pids-limit", "ShmSize": "--shm-size"}  # fmt: skip
    for key, flag in flags.items():
        if v := h.get(key):
            out += [flag, f"{v / 1e9:g}" if key == "NanoCpus" else str(v)]
    out += ["--read-only"] if h.get("ReadonlyRootfs") else []
    for key, flag in (("CapAdd", "--cap-add"), ("CapDrop", "--cap-drop"), ("SecurityOpt", "--security-opt")):
        for v in h.get(key) or []:
            out += [flag, v]
    for path, opts in (h.get("Tmpfs") or {}).items():
        out += ["--tmpfs", f"{path}:{opts}" if opts else path]
    for d in h.get("Devices") or []:
        out += ["--device", f"{d['PathOnHost']}:{d['PathInContainer']}:{d.get('CgroupPermissions') or 'rwm'}"]
    for r in h.get("DeviceRequests") or []:
        out += ["--gpus", _gpus(r)]
    for u in h.get("Ulimits") or []:
        out += ["--ulimit", f"{u['Name']}={u['Soft']}:{u['Hard']}"]
    if user := (info.get("Config") or {}).get("User"):
        out += ["--user", user]
    for m in info.get("Mounts") or []:
        if m.get("Type") == "bind":
            ro = "" if m.get("RW", True) else ",readonly"
            out += ["--mount", f"type=bind,source={m['Source']},target={m['Destination']}{ro}"]
        elif m.get("Type") == "tmpfs":
            out += ["--tmpfs", m["Destination"]]
    return out


def _gpus(request: Mapping) -> str:
    if ids := request.get("DeviceIDs"):
        return f"device={','.join(ids)}"
    count = request.get("Count") or 0
    return "all" if count < 0 else str(count)


def tf_config(names: list[str], index: int, port: int) -> str:
    """The trial task's TF_CONFIG: the job's task names (what the job's network resolves, the trial
    sharing each one's namespace) on the trial's own port."""
    chief, *workers = names
    spec = {"cluster": {"chief": [f"{chief}:{port}"], "worker": [f"{w}:{port}" for w in workers]},
            "task": {"type": "chief" if index == 0 else "worker", "index": max(0, index - 1)}}  # fmt: skip
    return json.dumps(spec, separators=(",", ":"))


def env_name(name: str) -> str:
    """A make variable (BYTES_PER_PACK) as the trainer reads it; a process variable (TF_..., GLIBC_...) as is."""
    return name if name.startswith(PROCESS_VARIABLES) else ENV_PREFIX + name


class Cluster(trial.Cluster):
    """One setting's trial cluster: a container per task of the job, in that task's namespace."""

    def __init__(self, name: str, index: int, tasks: list[Task], settings: Mapping[str, str], volume: str,
                 project: str, engine: Engine, proc: Path = Path("/proc"), kill=os.kill) -> None:  # fmt: skip
        super().__init__(name)
        self.index, self.tasks, self.volume, self.project = index, tasks, volume, project
        self.settings = {env_name(k): v for k, v in settings.items()}
        self.engine, self.proc, self.kill = engine, proc, kill
        self.containers: list[str] = []
        self.pids: list[int] = []
        """Host pid of each container's init (its trial process is that init's child)."""
        self.error = ""
        self._processes: list[int] = []

    @property
    def tf_port(self) -> int:
        return TF_PORT + self.index

    @property
    def metrics_port(self) -> int:
        return METRICS_PORT + self.index

    def run_argv(self, i: int) -> list[str]:
        """`docker run` of the trial's task i. `--init` always: the trial process is then never PID 1 of
        its namespace, which ignores a signal it has no handler for (the turns' SIGCONT)."""
        t = self.tasks[i]
        env = {**t.env, **TRIAL_ENV, **self.settings, "TF_CONFIG": tf_config([x.name for x in self.tasks], i,
               self.tf_port), ENV_PREFIX + "METRICS_PORT": str(self.metrics_port)}  # fmt: skip
        volume = (
            [f"type=volume,source={self.volume},target={deployment.CHECKPOINT_DIR}"] if t.checkpoint else []
        )
        return ["run", "-d", "--label", f"{LABEL}={self.project}", "--network", f"container:{t.container}",
                "--init", *t.options, *(a for v in volume for a in ("--mount", v)),
                *(a for k, v in env.items() for a in ("-e", f"{k}={v}")), t.image, *t.command]  # fmt: skip

    def start(self) -> None:
        """Every task's container; a refusal of the engine is this cluster's failure, not the tune's."""
        try:
            for i in range(len(self.tasks)):
                self.containers.append(self.engine.docker(*self.run_argv(i)).strip())
            for cid in self.containers:
                self.pids.append(int(self.engine.docker("inspect", "--format", "{{.State.Pid}}", cid) or 0))
        except (EngineError, ValueError) as err:
            self.error = f"its containers did not start ({err})"

    def failed(self) -> str:
        """Empty while every container's init lives (a look at /proc, no docker call per turn); else the
        first one ended, its exit code and the last error it printed, then its last lines."""
        if self.error:
            return self.error
        gone = [i for i, pid in enumerate(self.pids) if not _alive(self.proc, pid)]
        if not gone:
            return ""
        i = gone[0]
        code = self.engine.state(self.containers[i]).get("ExitCode", "?")
        r = self.engine.result("logs", "--tail", "15", self.containers[i])
        lines = [ln for ln in (r.stdout or "").splitlines() + (r.stderr or "").splitlines() if ln.strip()]
        cause = next((ln.strip() for ln in reversed(lines) if ERROR.search(ln)), "")
        head = f"its {self.tasks[i].name} exited {code}" + (f" ({cause[:200]})" if cause else "")
        return "\n".join([head, *lines[-15:]])

    def reading(self) -> scrape.Reading | None:
        import http.client

        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):  # not serving (yet, or now)
            return scrape.read(self.tasks[0].address, self.metrics_port)
        return None

    def signal(self, sig: int) -> None:
        for p in self.processes():
            with contextlib.suppress(ProcessLookupError):
                self.kill(p, sig)

    def processes(self) -> list[int]:
        """The trial's processes (host pids), found once every container's init has started its child: a
        trial process is never restarted (no supervisor), so they stay the same."""
        if not self._processes:
            found = descendants(self.proc, self.pids)
            if all(found.values()):
                self._processes = [p for kids in found.values() for p in kids]
            return [p for kids in found.values() for p in kids]
        return self._processes

    def stop(self) -> None:
        if self.containers:
            self.engine.result("rm", "-f", *self.containers)


def _alive(proc: Path, pid: int) -> bool:
    """Whether host process `pid` still runs (a container's init; 0: it had ended before it was read)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return False
    return pid > 0 and stat.rpartition(")")[2].split()[0] != "Z"


def descendants(proc: Path, pids: list[int]) -> dict[int, list[int]]:
    """Each of `pids`' descendants, from one scan of /proc's stat files (their parent pids; this kernel
    has no /proc/PID/task/TID/children): the trial's processes under each container's init."""
    parents: dict[int, list[int]] = {}
    for stat in proc.glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rpartition(")")[2].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out = {}
    for pid in pids:
        found, todo = [], [pid]
        while todo:
            kids = parents.get(todo.pop(), [])
            found += kids
            todo += kids
        out[pid] = found
    return out


def tasks(containers: Mapping[str, str], engine: Engine) -> list[Task]:
    """The job's tasks (name -> container id, the chief first) as trials reproduce them."""
    out = [task(name, engine.inspect(cid)) for name, cid in containers.items()]
    if not out or not out[0].checkpoint:
        raise InContainerError(f"the job's chief mounts no checkpoint volume at {deployment.CHECKPOINT_DIR}")
    if missing := [t.name for t in out if not t.address]:
        raise InContainerError(f"the job's {', '.join(missing)} has no address on the job's network")
    return out


def copies(tasks: list[Task], count: int, project: str, engine: Engine) -> list[str]:
    """`count` volumes, each a copy of the job's checkpoint volume (one per cluster), made by one
    throwaway container of the job's image as root (`cp -a` keeps the owner the trainer writes as)."""
    names = [f"{project}_tune{i}" for i in range(count)]
    for n in names:
        engine.docker("volume", "create", "--label", f"{LABEL}={project}", n)
    chief = tasks[0]
    mounts = [a for i, n in enumerate(names) for a in ("-v", f"{n}:/to/{i}")]
    copy = 'for d in /to/*; do cp -a /from/. "$d"/; done'
    engine.docker("run", "--rm", "--label", f"{LABEL}={project}", "--user", "0", "--network", "none",
                  "-v", f"{chief.checkpoint}:/from:ro", *mounts, "--entrypoint", "sh", chief.image, "-c", copy,
                  timeout=600)  # fmt: skip
    return names


def remove(project: str, engine: Engine) -> int:
    """Remove every trial container and volume of the project (this tune's, or a killed one's left
    behind); how many there were."""
    label = f"label={LABEL}={project}"
    ids = engine.query("ps", "-aq", "--filter", label).split()
    if ids:
        engine.result("rm", "-f", *ids)
    volumes = engine.query("volume", "ls", "-q", "--filter", label).split()
    if volumes:
        engine.result("volume", "rm", "-f", *volumes)
    return len(ids) + len(volumes)
