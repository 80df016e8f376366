"""Docker-in-Docker nodes for the e2e tests: compose/swarm/nodes.sh's node image and flags.

test_swarm.py runs three of them as a swarm (`make nodes-up`); test_engine_faults.py runs one as a
whole "host" whose engine it can kill and restart (the host's own dockerd is shared: never that one).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from monitoring.prom.client import PrometheusError
from tests.e2e.conftest import ROOT

NODES_SH = ROOT / "compose/swarm/nodes.sh"


def wait_until(what: str, check, timeout: float, interval: float = 2.0):
    """`check()` until it returns something true. Every 2 s by default: a check here is docker CLI
    calls into a node (a service's whole log, a node's state), each a Go process start and the node
    engine's work, and the waits are for tens of seconds; a wait that times what it sees polls faster."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if value := check():
                return value
        except (OSError, ValueError, PrometheusError):
            pass  # Prometheus or a node engine still starting
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# PID 2 of the node is a shell, not dockerd (the node's entrypoint execs dockerd): dockerd can be
# killed and started again while the node, its containers' shims and processes, lives on.
KEEP_NODE = '/usr/local/bin/node-entrypoint.sh "$@" & while :; do sleep 3600; done'


@dataclass(frozen=True)
class EngineNode:
    """One DinD node (`<name>-node-1` on its own network) whose engine the host reaches on a socket
    in a host folder; the repository is mounted at its own path, so a compose file generated here
    (bind mounts by absolute path) means the same files in there."""

    name: str
    subnet: str
    """The node network's /24 (the node is .11), away from every other e2e network."""

    @property
    def container(self) -> str:
        return f"{self.name}-node-1"

    @property
    def ip(self) -> str:
        return f"{self.subnet}.11"

    @property
    def socket_dir(self) -> Path:
        return Path("/tmp") / self.name

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket_dir}/docker.sock"

    @property
    def dockerd_args(self) -> list[str]:
        return ["-H", "unix:///var/run/docker.sock", "-H", "unix:///run/outer/docker.sock"]

    def nodes_sh(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        env = {**os.environ, "SWARM_NAME": self.name, "SWARM_SUBNET": self.subnet, "NODES": "1"}
        return subprocess.run(
            [str(NODES_SH), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )

    def start(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        opts = ["--entrypoint", "/bin/sh", "-v", f"{ROOT}:{ROOT}", "-v", f"{self.socket_dir}:/run/outer"]
        run = self.nodes_sh("run", "1", *opts, "--", "-c", KEEP_NODE, "sh", *self.dockerd_args, timeout=900)
        assert run.returncode == 0, f"the DinD node did not start:\n{run.stderr[-3000:]}"

    def remove(self) -> None:
        self.nodes_sh("down")

    def inner(self, *args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        """A docker command against the node's engine."""
        return subprocess.run(
            ["docker", "-H", self.docker_host, *args], capture_output=True, text=True, timeout=timeout, **kw
        )

    def engine_up(self) -> bool:
        try:
            return self.inner("info", "--format", "{{.ServerVersion}}", timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def wait_engine(self, timeout: float) -> float:
        wait_until(f"the engine in {self.container}", self.engine_up, timeout, interval=0.2)
        return time.time()

    def load(self, images: list[str]) -> None:
        save = subprocess.Popen(["docker", "save", *images], stdout=subprocess.PIPE)
        load = self.inner("load", "-q", stdin=save.stdout, timeout=1800)
        assert save.wait() == 0 and load.returncode == 0, load.stderr

    def kill_engine(self) -> None:
        """SIGKILL of the node's dockerd (its containerd goes with it; the containers' shims stay)."""
        subprocess.run(
            ["docker", "exec", self.container, "sh", "-c", 'kill -9 "$(cat /var/run/docker.pid)"'],
            check=True,
            capture_output=True,
        )
        wait_until("the node's dockerd gone", lambda: not self.engine_up(), timeout=30, interval=0.1)

    def start_engine(self) -> None:
        """dockerd again, as systemd would: /run kept (the running containers' shims are found there)."""
        subprocess.run(
            ["docker", "exec", "-d", self.container, "dockerd", *self.dockerd_args],
            check=True,
            capture_output=True,
        )

    def stop_engine(self, timeout: float) -> float:
        """SIGTERM to the node's dockerd, the path of `systemctl stop docker` (and of a restart): it
        stops every container at once (SIGTERM, SIGKILL after its stop timeout) and exits; returns
        when it has (its pid file, removed last, is gone), the seconds that took."""
        started = time.time()
        subprocess.run(
            ["docker", "exec", self.container, "sh", "-c", 'kill -TERM "$(cat /var/run/docker.pid)"'],
            check=True,
            capture_output=True,
        )
        wait_until("the node's dockerd to stop and exit", lambda: not self.engine_running(), timeout, 0.5)
        return time.time() - started

    def engine_running(self) -> bool:
        """The node's dockerd has not exited yet (a graceful stop keeps its pid file to the end)."""
        probe = ["docker", "exec", self.container, "test", "-e", "/var/run/docker.pid"]
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0

    def host_pid(self, node_pid: int) -> int:
        """This host's PID of the node's process `node_pid` (a PID as the node's engine's `docker top`
        gives it): the process whose NSpid has it at the node's level and whose parents lead to the
        node's own PID 1, so that it can be signalled from here as fast as a host container's."""
        root = int(
            subprocess.run(
                ["docker", "inspect", "-f", "{{.State.Pid}}", self.container],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                fields = dict(ln.split(":", 1) for ln in status.read_text().splitlines() if ":" in ln)
            except OSError:
                continue  # gone meanwhile
            ids = [int(i) for i in fields.get("NSpid", "").split()]
            if len(ids) >= 2 and ids[1] == node_pid and descends(ids[0], root):
                return ids[0]
        raise AssertionError(f"no host process is PID {node_pid} of {self.container}")

    def reboot(self) -> None:
        """`docker restart` of the node: every process in it dies at once, its engine starts again."""
        subprocess.run(["docker", "restart", self.container], check=True, capture_output=True, timeout=120)

    def engine_root(self) -> Path:
        """The node's /var/lib/docker on this host (its volume)."""
        out = subprocess.run(
            ["docker", "volume", "inspect", "-f", "{{.Mountpoint}}", f"{self.container}-lib"],
            capture_output=True,
            text=True,
            check=True,
        )
        return Path(out.stdout.strip())


def descends(pid: int, ancestor: int) -> bool:
    """`pid` is `ancestor` or one of its descendants (by the parent PIDs in /proc)."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        pid = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid:")))
    return pid == ancestor
