"""Where the sweep's tasks run: local processes, the stack's containers (or temporary ones on its
network), or temporary containers on a bridge of their own; and the TCP connections between two."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import dataclass

from compose.engine import Engine


@dataclass(frozen=True)
class Endpoint:
    task: str
    address: str
    """Host or IP the other tasks reach this one at."""
    exec_prefix: tuple[str, ...] = ()
    """Runs a command in the endpoint: () on this host, `docker exec <id>` in a container."""
    netns_pid: int | None = None
    """A process in the endpoint's network namespace (iperf3 via nsenter); None = this host's."""


def local_endpoints(workers: int) -> list[Endpoint]:
    return [Endpoint("chief", "127.0.0.1")] + [Endpoint(f"worker-{i}", "127.0.0.1") for i in range(workers)]


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]").removeprefix("::ffff:"), int(port)


def connections_between(ss_output: str, ours: tuple[str, int], theirs: tuple[str, int]) -> int:
    """TCP connections between two tasks, from `ss -tnH state established` in the first one's network
    namespace: the other task's connections to our server port plus ours to its server port. Each is
    counted at one end only, so both tasks on 127.0.0.1 (one namespace) count once too."""
    count = 0
    for line in ss_output.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        local, peer = _address(fields[-2]), _address(fields[-1])
        into_ours = local == ours and peer[0] == theirs[0]
        into_theirs = peer == theirs and local[0] == ours[0] and local[1] != ours[1]
        count += into_ours or into_theirs
    return count


class StreamCounter(threading.Thread):
    """Samples the connections between the first two tasks while the sweep runs; `peak` is the most."""

    def __init__(self, endpoint: Endpoint, ours: tuple[str, int], theirs: tuple[str, int]):
        super().__init__(daemon=True)
        self.cmd = _in_netns(endpoint, "ss", "-tnH", "state", "established")
        self.ours, self.theirs, self.peak, self.done = ours, theirs, 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.5):
            out = subprocess.run(self.cmd, capture_output=True, text=True).stdout
            self.peak = max(self.peak, connections_between(out, self.ours, self.theirs))


def _in_netns(e: Endpoint, *cmd: str) -> list[str]:
    return (["nsenter", "-t", str(e.netns_pid), "-n"] if e.netns_pid else []) + list(cmd)


def _docker(*args: str) -> str:
    """stdout of `docker ARGS` through the engine adapter (compose/engine.py); CalledProcessError on failure."""
    r = Engine().result(*args, timeout=None)
    if r.returncode:
        raise subprocess.CalledProcessError(r.returncode, ["docker", *args], r.stdout, r.stderr)
    return r.stdout.strip()


def stack_containers(project: str) -> dict[str, tuple[str, str]]:
    """Trainer task -> (container id, state) of the compose project; {} when there is none (or no engine)."""
    try:
        out = _docker(
            "ps",
            "-a",
            "--filter",
            f"label=com.docker.compose.project={project}",
            "--format",
            '{{.ID}} {{.Label "com.docker.compose.service"}} {{.State}}',
        )
    except (OSError, subprocess.CalledProcessError):
        return {}
    tasks = {}
    for line in out.splitlines():
        cid, service, state = line.split()
        if service == "chief" or service.startswith("worker-"):
            tasks[service] = (cid, state)
    return dict(sorted(tasks.items(), key=lambda kv: (kv[0] != "chief", len(kv[0]), kv[0])))


def _endpoint(task: str, cid: str, network: str) -> Endpoint:
    ip = _docker("inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}', cid)
    return Endpoint(task, ip, ("docker", "exec", cid), int(_docker("inspect", "-f", "{{.State.Pid}}", cid)))


def docker_endpoints(project: str) -> tuple[list[Endpoint], object]:
    """The stack's trainer containers if they all run (the bench then shares their CPUs with the
    training), else temporary containers from the same image on the same network; and a cleanup."""
    containers = stack_containers(project)
    if not containers:
        raise SystemExit("bench-comm: no compose stack (make up), use --where local")
    first = next(iter(containers.values()))[0]
    networks = json.loads(_docker("inspect", "-f", "{{json .NetworkSettings.Networks}}", first))
    network = next((n for n in networks if n.endswith("_cluster")), next(iter(networks)))
    if all(state == "running" for _, state in containers.values()):
        print(
            "bench-comm: running inside the live trainer containers (training, if any, competes for CPU)",
            file=sys.stderr,
        )
        return [_endpoint(t, cid, network) for t, (cid, _) in containers.items()], lambda: None
    image = _docker("inspect", "-f", "{{.Config.Image}}", first)
    print(
        f"bench-comm: the trainers are not all running: temporary containers from {image} on {network}",
        file=sys.stderr,
    )
    return temporary_endpoints(image, network, list(containers), project)


def temporary_endpoints(
    image: str, network: str, tasks: list[str], project: str
) -> tuple[list[Endpoint], object]:
    """One idle container of `image` per task on `network`, and the cleanup that removes them."""
    started = []

    def cleanup() -> None:
        if started:
            Engine().result("rm", "-f", *started, timeout=None)

    try:
        for task in tasks:
            started.append(
                _docker(
                    "run",
                    "-d",
                    "--rm",
                    "--init",
                    "--name",
                    f"{project}-bench-{task}",
                    "--label",
                    "org.mwms.bench=1",
                    "--network",
                    network,
                    "--user",
                    "1000:1000",
                    "--entrypoint",
                    "sleep",
                    image,
                    "infinity",
                )
            )
        return [_endpoint(t, cid, network) for t, cid in zip(tasks, started)], cleanup
    except BaseException:
        cleanup()
        raise


def bridge_endpoints(image: str, project: str, workers: int) -> tuple[list[Endpoint], object]:
    """A chief and `workers` containers of the trainer image on a bridge network of their own, as the
    compose stack's tasks talk (container to container through the bridge); removed afterwards."""
    try:
        _docker("image", "inspect", "-f", "{{.Id}}", image)
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit(
            f"bench-comm: no image {image} (make images IMAGE_REPO=...), or use --where local"
        ) from None
    network = f"{project}-benchcomm"
    _docker("network", "create", "--driver", "bridge", "--label", "org.mwms.bench=1", network)
    try:
        endpoints, remove = temporary_endpoints(
            image, network, ["chief"] + [f"worker-{i}" for i in range(workers)], project
        )
    except BaseException:
        Engine().result("network", "rm", network, timeout=None)
        raise

    def cleanup() -> None:
        remove()
        Engine().result("network", "rm", network, timeout=None)

    return endpoints, cleanup
