"""`make bench-comm`: TensorFlow's own all-reduce, 4 KiB to 64 MiB and gradient-shaped, next to iperf3.

    python -m bench.comm [--where auto|local|docker|bridge] [--workers 1] [--out .run/bench-comm]

Runs on the host only (drives Docker and iperf3). It starts one sweep task per cluster task
(`python -m trainer.bench.allreduce_sweep`, the in-container half), either as local processes on
127.0.0.1 (a fresh chief + --workers workers, like bench.launch), inside the compose stack's
containers (its running trainers, else temporary ones from the same image on its network), or
(`bridge`) in temporary containers of the trainer image on a bridge network of their own. Payloads:
8 equal tensors per size (the size axis the projection fits), and the `mlp`, `cnn` and ResNet-50-like
gradient lists (bench/payloads.py), so that packing packs several tensors. Every cell is timed
--repeats times: median and min-max are printed, and a setting is named best only when its slowest
repeat beats the runner-up's fastest. Bandwidths follow nccl-tests: algbw = bytes / time,
busbw = algbw x 2(n-1)/n. iperf3 runs between the first two tasks' network namespaces (nsenter for
containers) with as many streams as TensorFlow held connections between them (counted with `ss`
during the sweep). Writes <out>.json (monitoring/benchcomm_result.py, which `make diagnose` reads),
<out>.png and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import contract
from monitoring.benchcomm_result import Result, Row
from trainer.host import __version__, server_config
from trainer.host import allreduce_sweep as sweep

PAYLOADS = ("mlp", "cnn", "resnet50")
"""Named in bench/payloads.py (not imported here: it loads TensorFlow)."""
BENCH_PORT = 2223  # beside the trainer's 2222, so a bench can run in the trainer's own containers


def busbw(algbw: float, n: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: what each link carries, comparable across n."""
    return algbw * 2 * (n - 1) / n


def rows(timings: list[dict], n: int) -> list[Row]:
    """Per (variant, payload, size): each repeat's slowest task (a collective ends when its last task
    does), then the median, min and max over the repeats."""
    out = []
    for key in dict.fromkeys((t["variant"], t.get("payload", sweep.EQUAL), t["size"]) for t in timings):
        per_task = [
            t["samples"] for t in timings if (t["variant"], t.get("payload", sweep.EQUAL), t["size"]) == key
        ]
        repeats = [max(times) for times in zip(*per_task)]
        seconds = statistics.median(repeats)
        variant, payload, size = key
        out.append(
            Row(
                variant,
                size,
                seconds,
                size / seconds,
                busbw(size / seconds, n),
                payload=payload,
                seconds_min=min(repeats),
                seconds_max=max(repeats),
            )
        )
    return sorted(out, key=lambda r: (r.payload != sweep.EQUAL, r.size))


def winner(cell: list[Row]) -> str:
    """The fastest setting of one (payload, size), named only when its slowest repeat beats the
    runner-up's fastest (the spreads do not overlap); else "no clear winner"."""
    first, second = sorted(cell, key=lambda r: r.seconds)[:2] if len(cell) > 1 else (cell[0], None)
    if second is None or first.seconds_max < second.seconds_min:
        return first.variant
    return "no clear winner"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 1000 else f"{ms:.0f}"


def _cell(r: Row | None) -> str:
    if r is None:
        return "| " + " " * 31
    spread = f"{_ms(r.seconds_min)}-{_ms(r.seconds_max)}"
    return f"| {r.seconds * 1e3:>8.3f} {spread:>13} {r.busbw / 1e6:>7.1f} "


def format_table(table: list[Row], tcp: float | None, streams: int = 1) -> str:
    variants = list(dict.fromkeys(r.variant for r in table))
    head = (
        f"{'payload':>8} {'size':>11} " + "".join(f"| {v:^30} " for v in variants) + "| best (beyond spread)"
    )
    sub = f"{'':>20} " + "| {:>8} {:>13} {:>7} ".format("median", "min-max ms", "busbw") * len(variants)
    lines = [head, sub]
    for payload, size in dict.fromkeys((r.payload, r.size) for r in table):
        cell = [r for r in table if (r.payload, r.size) == (payload, size)]
        by_variant = {r.variant: r for r in cell}
        lines.append(
            f"{payload:>8} {sweep.human(size):>11} "
            + "".join(_cell(by_variant.get(v)) for v in variants)
            + f"| {winner(cell)}"
        )
    lines.append(
        "times in ms per all-reduce, median and min-max over the repeats; busbw in MB/s (1e6 bytes/s) = size/time x 2(n-1)/n "
        "(nccl-tests)"
    )
    if tcp:
        b = Result("", 0, "", tcp, tuple(table)).best
        lines.append(
            f"raw TCP (iperf3, {streams} stream{'s' * (streams > 1)}) between the first two tasks: "
            f"{tcp / 1e6:.0f} MB/s"
        )
        lines.append(
            f"best busbw at {sweep.human(b.size)} ({b.payload}): {b.variant} {b.busbw / 1e6:.1f} MB/s = "
            f"{100 * b.busbw / tcp:.1f}% of raw TCP"
        )
    return "\n".join(lines)


SERVER_CANDIDATES = (
    "stock",
    "recv_buf_max_chunk=-1",
    "recv_buf_max_chunk=1048576",
    "num_channels_per_target=4",
    "recv_buf_max_chunk=-1+num_channels_per_target=4",
)
"""What `make bench-comm` A/Bs by default (docs/communication.md says why each)."""

_KEEP = "glibc.malloc.trim_threshold=4294967295:glibc.malloc.top_pad=268435456"
ENV_CANDIDATES = {
    "malloc-thp-keep": f"GLIBC_TUNABLES=glibc.malloc.hugetlb=1:{_KEEP}",
    "malloc-thp": "GLIBC_TUNABLES=glibc.malloc.hugetlb=1",
    "malloc-keep": f"GLIBC_TUNABLES={_KEEP}",
    "malloc-nommap-thp-keep": f"GLIBC_TUNABLES=glibc.malloc.mmap_max=0:{_KEEP}:glibc.malloc.hugetlb=1",
    "bfc": "TF_CPU_ALLOCATOR_USE_BFC=1",
}
"""Process environments A/B'd on TF's stock server (`--envs`): the allocator settings that act on the
page faults perf found (docs/communication.md). glibc reads its tunables only at process start.
malloc-thp-keep is trainer.cluster.server_config.ENVIRONMENT, the default every task gets."""


def env_setting(entry: str) -> tuple[str, dict[str, str]]:
    """A `--envs` entry (a name in ENV_CANDIDATES, or NAME=VALUE) -> (label, environment)."""
    text = ENV_CANDIDATES.get(entry, entry)
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise SystemExit(
            f"bench-comm: --envs {entry!r}: expected NAME=VALUE or one of {', '.join(ENV_CANDIDATES)}"
        )
    return (entry if entry in ENV_CANDIDATES else text), {name: value}


def server_ab(endpoints: list[Endpoint], args) -> tuple[list[dict], list[float]]:
    """Every task's timings of the A/B payload under each server setting, then each environment on
    the stock server (a fresh cluster each: both are read at start), the variant named
    `RING/0 <setting>` or `RING/0 env:<label>`; and the 1-minute load average before and after each
    cluster. --rounds repeats the whole list, odd rounds in reverse (a slow drift of the shared
    machine's load then favours no setting); a cell's repeats are all its rounds' together."""
    stock_env = dict.fromkeys(server_config.ENVIRONMENT, "")  # glibc's own defaults: the reference
    runs = [(s, s, stock_env) for s in args.servers.split(";") if s]
    envs = map(env_setting, filter(None, args.envs.split(";")))
    runs += [("stock", f"env:{label}", {**stock_env, **env}) for label, env in envs]
    task_args = ["--sizes", "", "--variants", "RING/0", "--repeats", str(args.repeats)]
    task_args += ["--shapes", json.dumps(payload_shapes(args.ab_payload))] if runs else []
    out, loads = [], []
    for round_ in range(args.rounds):
        for setting, label, env in runs if round_ % 2 == 0 else runs[::-1]:
            loads.append(os.getloadavg()[0])
            print(
                f"bench-comm: A/B round {round_ + 1}/{args.rounds} {label} (load {loads[-1]:.1f})",
                file=sys.stderr,
                flush=True,
            )
            results, _ = _run_sweep(endpoints, [*task_args, "--server", setting], env)
            loads.append(os.getloadavg()[0])
            for r in results:
                name = label if env is not stock_env else r.get("server", setting)
                out += [{**t, "variant": f"RING/0 {name}", "task": r.get("task")} for t in r["timings"]]
    return merged_rounds(out), loads


def merged_rounds(timings: list[dict]) -> list[dict]:
    """One timing per (task, variant, payload, size), its rounds' repeats concatenated in order."""
    merged: dict[tuple, dict] = {}
    for t in timings:
        key = (t.get("task"), t["variant"], t.get("payload", sweep.EQUAL), t["size"])
        if key not in merged:
            merged[key] = {**t, **{k: list(t[k]) for k in ("samples", "cpu", "faults") if k in t}}
            continue
        for k in ("samples", "cpu", "faults"):
            if k in t:
                merged[key][k] += t[k]
    return list(merged.values())


def format_cpu(timings: list[dict]) -> str:
    """CPU seconds and minor page faults per all-reduce summed over the tasks (median and min-max
    over the repeats): the cost of a setting whatever else shares the cores, which moves its wall
    time on a loaded machine."""
    lines = ["CPU per all-reduce, all tasks (ms, median and min-max over the repeats; page faults, median):"]
    for payload in dict.fromkeys(t.get("payload", sweep.EQUAL) for t in timings):
        of_payload = [t for t in timings if t.get("payload", sweep.EQUAL) == payload]
        for variant in dict.fromkeys(t["variant"] for t in of_payload):
            total = _summed(of_payload, variant, "cpu")
            faults = _summed(of_payload, variant, "faults")
            if total:
                lines.append(
                    f"  {payload:>8} {variant:<50} {statistics.median(total) * 1e3:8.2f} "
                    f"{min(total) * 1e3:.2f}-{max(total) * 1e3:.2f}"
                    + (f"  {statistics.median(faults):9.0f} faults" if faults else "")
                )
    return "\n".join(lines)


def format_rounds(timings: list[dict], repeats: int) -> str:
    """Each cluster's median wall time per all-reduce (each repeat's slowest task), in round order:
    how far apart two clusters of one setting land, which the pooled spread hides."""
    lines = ["ms per all-reduce, each round's cluster's median (the rounds in order):"]
    for payload in dict.fromkeys(t.get("payload", sweep.EQUAL) for t in timings):
        for variant in dict.fromkeys(
            t["variant"] for t in timings if t.get("payload", sweep.EQUAL) == payload
        ):
            per_task = [
                t["samples"]
                for t in timings
                if t["variant"] == variant and t.get("payload", sweep.EQUAL) == payload
            ]
            slowest = [max(v) for v in zip(*per_task)]
            medians = [statistics.median(slowest[i : i + repeats]) for i in range(0, len(slowest), repeats)]
            lines.append(f"  {payload:>8} {variant:<50} " + " ".join(f"{m * 1e3:.2f}" for m in medians))
    return "\n".join(lines)


def _summed(timings: list[dict], variant: str, key: str) -> list[float]:
    """Per repeat, `key` summed over the tasks that measured `variant`."""
    return [sum(v) for v in zip(*(t[key] for t in timings if t["variant"] == variant and key in t))]


def payload_shapes(names: str) -> dict[str, list[tuple[int, ...]]]:
    """The named payloads' shapes, derived here (the host has TensorFlow and bench) and passed
    to the tasks; an unknown name exits with one line."""
    wanted = [n for n in names.split(",") if n]
    unknown = [n for n in wanted if n not in PAYLOADS]
    if unknown:
        raise SystemExit(
            f"bench-comm: --payloads {','.join(unknown)}: unknown, choose from {', '.join(PAYLOADS)}"
        )
    if not wanted:
        return {}
    from bench import payloads

    return {n: payloads.NAMED[n]() for n in wanted}


def iperf_bytes_per_second(report: dict) -> float:
    """Receiver-side throughput from `iperf3 -J`."""
    return report["end"]["sum_received"]["bits_per_second"] / 8


# --- The driver: where the tasks run, iperf3, table, JSON, PNG ---


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


def _run_sweep(
    endpoints: list[Endpoint], task_args: list[str], extra_env: dict[str, str] | None = None
) -> tuple[list[dict], int]:
    """Every task's result, and the most TCP connections seen between the first two tasks;
    `extra_env` is set in every task's process (an allocator setting of the A/B)."""
    extra_env = extra_env or {}
    from bench.launch import _die_with_parent, free_ports, stop
    from trainer.host import ClusterSpec

    ports = free_ports(len(endpoints)) if not endpoints[0].exec_prefix else [BENCH_PORT] * len(endpoints)
    addrs = [f"{e.address}:{p}" for e, p in zip(endpoints, ports)]
    pair = [(e.address, p) for e, p in zip(endpoints, ports)][:2]
    counter = StreamCounter(endpoints[0], pair[0], pair[-1])
    spec = ClusterSpec(chief=(addrs[0],), worker=tuple(addrs[1:]), task=_task_id(endpoints[0].task))
    procs = []
    for e in endpoints:
        tf_config = spec.with_task(_task_id(e.task)).to_tf_config()
        cmd = [sys.executable, "-m", "trainer.bench.allreduce_sweep", *task_args]
        env = {**os.environ, "TF_CONFIG": tf_config, "PYTHONUNBUFFERED": "1", **extra_env}
        if e.exec_prefix:  # the container's own Python and TF_CONFIG
            cmd = [
                *e.exec_prefix[:2],
                "-e",
                f"TF_CONFIG={tf_config}",
                "-e",
                "PYTHONUNBUFFERED=1",
                *(arg for k, v in extra_env.items() for arg in ("-e", f"{k}={v}")),
                *e.exec_prefix[2:],
                "python",
                *cmd[1:],
            ]
        procs.append(
            (
                e.task,
                subprocess.Popen(
                    cmd, env=env, stdout=subprocess.PIPE, text=True, preexec_fn=_die_with_parent
                ),
            )
        )
    results = []
    counter.start()
    try:
        for name, proc in procs:
            out, _ = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"bench task {name} exited with {proc.returncode}")
            results.append(
                next(
                    json.loads(line[len(sweep.RESULT) :])
                    for line in out.splitlines()
                    if line.startswith(sweep.RESULT)
                )
            )
    finally:
        counter.done.set()
        stop(procs)
    return results, counter.peak


def _task_id(name: str):
    from trainer.host import CHIEF, WORKER, TaskId

    return TaskId(CHIEF, 0) if name == "chief" else TaskId(WORKER, int(name.rsplit("-", 1)[1]))


def tcp_throughput(server: Endpoint, client: Endpoint, streams: int = 1, port: int = 5201) -> float | None:
    """iperf3 from client to server with `streams` parallel streams (-P), bytes/s; None (with a hint)
    when iperf3 is missing."""
    seconds = 3
    if not server.netns_pid:  # this host's loopback, shared with everything else here
        from bench.launch import free_ports

        port = free_ports(1)[0]

    def cmd(e: Endpoint, *args: str) -> list[str]:
        return _in_netns(e, "iperf3", *args)

    if subprocess.run(["sh", "-c", "command -v iperf3"], capture_output=True).returncode != 0:
        print("bench-comm: iperf3 not found (apt-get install iperf3): no TCP reference", file=sys.stderr)
        return None
    srv = subprocess.Popen(
        cmd(server, "-s", "-1", "-p", str(port)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(50):  # the server is up within ~0.1 s; it accepts exactly one test (-1)
            r = subprocess.run(
                cmd(
                    client,
                    "-c",
                    server.address,
                    "-p",
                    str(port),
                    "-t",
                    str(seconds),
                    "-P",
                    str(streams),
                    "-J",
                ),
                capture_output=True,
                text=True,
                timeout=seconds + 30,
            )
            report = json.loads(r.stdout or "{}")
            if r.returncode == 0 and "error" not in report:
                return iperf_bytes_per_second(report)
            time.sleep(0.1)  # refused: the server is not listening yet
        print(f"bench-comm: iperf3 failed: {r.stdout[-300:]} {r.stderr[-300:]}", file=sys.stderr)
        return None
    finally:
        srv.kill()
        srv.wait()


# --- Containers of the compose stack (project PROJECT) ---


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout.strip()


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
            subprocess.run(["docker", "rm", "-f", *started], capture_output=True)

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
        subprocess.run(["docker", "network", "rm", network], capture_output=True)
        raise

    def cleanup() -> None:
        remove()
        subprocess.run(["docker", "network", "rm", network], capture_output=True)

    return endpoints, cleanup


def write_png(table: list[Row], tcp: float | None, n: int, where: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5))
    for variant in dict.fromkeys(r.variant for r in table):
        mine = [r for r in table if r.variant == variant and r.payload == sweep.EQUAL]
        ax_bw.plot([r.size for r in mine], [r.busbw / 1e6 for r in mine], marker="o", label=variant)
        ax_t.plot([r.size for r in mine], [r.seconds * 1e3 for r in mine], marker="o", label=variant)
    if tcp:
        ax_bw.axhline(
            tcp / 1e6, color="black", linestyle="--", label=f"raw TCP (iperf3) {tcp / 1e6:.0f} MB/s"
        )
    ax_bw.set(
        xscale="log",
        yscale="log",
        xlabel="bytes per all-reduce",
        ylabel="busbw MB/s",
        title=f"TensorFlow all-reduce bus bandwidth, {n} tasks ({where})",
    )
    ax_t.set(
        xscale="log",
        yscale="log",
        xlabel="bytes per all-reduce",
        ylabel="ms per all-reduce",
        title="time per all-reduce",
    )
    for ax in (ax_bw, ax_t):
        ticks = sorted({r.size for r in table if r.payload == sweep.EQUAL})
        ax.set_xticks(ticks, [sweep.human(s) for s in ticks], rotation=45)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.comm", description=__doc__.splitlines()[0])
    p.add_argument(
        "--where",
        choices=("auto", "local", "docker", "bridge"),
        default="auto",
        help="auto: the compose stack's containers if it exists, else local processes; bridge: temporary "
        "containers of --image on a bridge network of their own",
    )
    p.add_argument(
        "--image",
        default=f"{os.environ.get('IMAGE_REPO', 'mwms/trainer')}:{__version__}-cpu",
        help="--where bridge: the trainer image (default IMAGE_REPO:<version>-cpu)",
    )
    p.add_argument(
        "--project",
        default=os.environ.get("PROJECT", contract.DEFAULT_PROJECT),
        help="compose project (make up PROJECT=)",
    )
    p.add_argument(
        "--workers", type=int, default=1, help="local, bridge: workers besides the chief (default 1: 2 tasks)"
    )
    p.add_argument("--sizes", default=",".join(map(str, sweep.SIZES)), help="bytes, comma-separated")
    p.add_argument(
        "--variants", default=",".join(sweep.VARIANTS), help="IMPLEMENTATION/bytes_per_pack, comma-separated"
    )
    p.add_argument(
        "--payloads",
        default=",".join(PAYLOADS),
        help=f"gradient-shaped tensor lists besides the equal-tensor sizes ({', '.join(PAYLOADS)}; '' = none)",
    )
    p.add_argument(
        "--repeats", type=int, default=sweep.REPEATS, help="timed calls per cell (the spread is over them)"
    )
    p.add_argument(
        "--servers",
        default=";".join(SERVER_CANDIDATES),
        help="gRPC server settings to A/B after the sweep, ';'-separated (trainer/cluster/server_config.py; "
        "'stock' = TF's own), each on a fresh cluster; '' = none",
    )
    p.add_argument(
        "--envs",
        default="malloc-thp-keep;malloc-thp;malloc-keep",
        help=f"process environments to A/B on the stock server, ';'-separated: NAME=VALUE or one of "
        f"{', '.join(ENV_CANDIDATES)}; '' = none",
    )
    p.add_argument(
        "--ab-payload",
        default="resnet50",
        help=f"the payload(s) the A/B times (RING/0, one pack), comma-separated ({', '.join(PAYLOADS)})",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="A/B rounds: every setting once per round, odd rounds in reverse order (interleaved)",
    )
    p.add_argument("--out", type=Path, default=Path(".run/bench-comm"), help="writes OUT.json and OUT.png")
    return p


def _task_args(args: argparse.Namespace) -> list[str]:
    """What every task's sweep (trainer.bench.allreduce_sweep) is asked to time."""
    sizes = [sweep.parse_bytes(s) for s in args.sizes.split(",") if s]
    return [
        "--sizes",
        ",".join(map(str, sizes)),
        "--variants",
        args.variants,
        "--repeats",
        str(args.repeats),
        "--shapes",
        json.dumps(payload_shapes(args.payloads)),
    ]


def _endpoints(args: argparse.Namespace) -> tuple[str, list, Callable[[], None]]:
    """Where the tasks run (auto: the stack's containers if up, else local processes), and their cleanup."""
    where = args.where
    if where == "auto":
        where = "docker" if stack_containers(args.project) else "local"
    if where == "docker":
        return (where, *docker_endpoints(args.project))
    if where == "bridge":
        return (where, *bridge_endpoints(args.image, args.project, args.workers))
    return where, local_endpoints(args.workers), lambda: None


def _measure(where: str, endpoints: list, args: argparse.Namespace) -> tuple[list, int, list, dict | None]:
    """The sweep, the server-settings A/B, and iperf3 at TensorFlow's own stream count."""
    print(
        f"bench-comm: {len(endpoints)} tasks ({where}): "
        + ", ".join(f"{e.task}@{e.address}" for e in endpoints),
        file=sys.stderr,
        flush=True,
    )
    # as every task runs (containers have it already; local processes get it here)
    results, streams = _run_sweep(endpoints, _task_args(args), dict(server_config.ENVIRONMENT))
    ab, loads = server_ab(endpoints, args)
    tcp = None
    if len(endpoints) > 1:
        print(
            f"bench-comm: TensorFlow held {streams} TCP connection(s) between {endpoints[0].task} and "
            f"{endpoints[1].task} (ss, sampled during the sweep): iperf3 -P {max(streams, 1)}",
            file=sys.stderr,
        )
        tcp = tcp_throughput(endpoints[0], endpoints[1], max(streams, 1))
    return results, streams, (ab, loads), tcp


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    where, endpoints, cleanup = _endpoints(args)
    try:
        results, streams, (ab, loads), tcp = _measure(where, endpoints, args)
    finally:
        cleanup()
    n = results[0]["n"]
    table = rows([t for r in results for t in r["timings"]], n)
    if table:  # empty when only the A/B was asked for (--sizes '' --payloads '')
        print(format_table(table, tcp, max(streams, 1)))
    if ab:
        ab_table = rows(ab, n)
        print(f"\ngRPC server settings A/B ({args.ab_payload}, RING/0, each on a fresh cluster):")
        print(format_table(ab_table, tcp, max(streams, 1)))
        print(format_cpu(ab))
        if args.rounds > 1:
            print(format_rounds(ab, args.repeats))
        print(
            f"load average (1 min) before/after each A/B cluster, {args.rounds} round(s): "
            f"{min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})"
        )
        table = table + ab_table
    Result(where=where, n=n, tf_version=results[0]["tf_version"], tcp=tcp, rows=tuple(table)).write(
        args.out.with_suffix(".json")
    )
    written = [args.out.with_suffix(".json")]
    if any(r.payload == sweep.EQUAL for r in table):  # the plot's axis is the equal-tensor sizes
        write_png(table, tcp, n, where, args.out.with_suffix(".png"))
        written.append(args.out.with_suffix(".png"))
    print(f"bench-comm: wrote {' and '.join(map(str, written))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
