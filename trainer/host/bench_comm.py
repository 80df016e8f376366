"""`make bench-comm`: TensorFlow's own all-reduce from 4 KiB to 64 MiB, next to raw TCP (iperf3).

    python -m trainer.host.bench_comm [--where auto|local|docker] [--workers 1] [--out .run/bench-comm]

Runs on the host only (drives Docker and iperf3). It starts one sweep task per cluster task
(`python -m trainer.allreduce_sweep`, the in-container half), either as local processes on
127.0.0.1 (a fresh chief + --workers workers, like trainer.host.launch) or, when the compose
stack's trainer image is there, inside containers on the stack's network (its running trainer
containers, else temporary ones from the same image). Bandwidths follow nccl-tests:
algbw = bytes / time, busbw = algbw x 2(n-1)/n. iperf3 measures TCP between the first two tasks'
network namespaces (nsenter for containers). Writes <out>.json, <out>.png and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from trainer.allreduce_sweep import RESULT, SIZES, VARIANTS, human, parse_bytes

BENCH_PORT = 2223  # beside the trainer's 2222, so a bench can run in the trainer's own containers


@dataclass(frozen=True)
class Row:
    variant: str
    size: int
    """Bytes all-reduced per call (the whole payload)."""
    seconds: float
    """Median time of one all-reduce, slowest task."""
    algbw: float
    busbw: float






def busbw(algbw: float, n: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: what each link carries, comparable across n."""
    return algbw * 2 * (n - 1) / n




def rows(timings: list[dict], n: int) -> list[Row]:
    """Per (variant, size) the slowest task's median (a collective ends when its last task does)."""
    out = []
    for variant in dict.fromkeys(t["variant"] for t in timings):
        for size in sorted({t["size"] for t in timings if t["variant"] == variant}):
            seconds = max(t["seconds"] for t in timings if (t["variant"], t["size"]) == (variant, size))
            out.append(Row(variant, size, seconds, size / seconds, busbw(size / seconds, n)))
    return out


def best(table: list[Row]) -> Row:
    """The knob setting with the highest busbw at the largest size."""
    largest = max(r.size for r in table)
    return max((r for r in table if r.size == largest), key=lambda r: r.busbw)


def format_table(table: list[Row], tcp: float | None) -> str:
    variants = list(dict.fromkeys(r.variant for r in table))
    head = f"{'size':>9} " + "".join(f"| {v:^29} " for v in variants)
    sub = f"{'':>9} " + "| {:>9} {:>9} {:>9} ".format("time ms", "algbw", "busbw") * len(variants)
    lines = [head, sub]
    for size in sorted({r.size for r in table}):
        cells = []
        for v in variants:
            r = next((r for r in table if (r.variant, r.size) == (v, size)), None)
            cells.append(
                f"| {r.seconds * 1e3:>9.3f} {r.algbw / 1e6:>9.1f} {r.busbw / 1e6:>9.1f} "
                if r
                else "| " + " " * 30
            )
        lines.append(f"{human(size):>9} " + "".join(cells))
    lines.append("bandwidths in MB/s (1e6 bytes/s); busbw = algbw x 2(n-1)/n (nccl-tests)")
    if tcp:
        b = best(table)
        lines.append(f"raw TCP (iperf3) between the first two tasks: {tcp / 1e6:.0f} MB/s")
        lines.append(
            f"best at {human(b.size)}: {b.variant} busbw {b.busbw / 1e6:.1f} MB/s = "
            f"{100 * b.busbw / tcp:.1f}% of raw TCP"
        )
    return "\n".join(lines)


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


def _run_sweep(endpoints: list[Endpoint], task_args: list[str]) -> list[dict]:
    from trainer.cluster import ClusterSpec
    from trainer.host.launch import _die_with_parent, free_ports, stop

    ports = free_ports(len(endpoints)) if not endpoints[0].exec_prefix else [BENCH_PORT] * len(endpoints)
    addrs = [f"{e.address}:{p}" for e, p in zip(endpoints, ports)]
    spec = ClusterSpec(chief=(addrs[0],), worker=tuple(addrs[1:]), task=_task_id(endpoints[0].task))
    procs = []
    for e in endpoints:
        tf_config = spec.with_task(_task_id(e.task)).to_tf_config()
        cmd = [sys.executable, "-m", "trainer.allreduce_sweep", *task_args]
        env = {**os.environ, "TF_CONFIG": tf_config, "PYTHONUNBUFFERED": "1"}
        if e.exec_prefix:  # the container's own Python and TF_CONFIG
            cmd = [
                *e.exec_prefix[:2],
                "-e",
                f"TF_CONFIG={tf_config}",
                "-e",
                "PYTHONUNBUFFERED=1",
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
    try:
        for name, proc in procs:
            out, _ = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"bench task {name} exited with {proc.returncode}")
            results.append(
                next(json.loads(line[len(RESULT) :]) for line in out.splitlines() if line.startswith(RESULT))
            )
    finally:
        stop(procs)
    return results


def _task_id(name: str):
    from trainer.cluster import CHIEF, WORKER, TaskId

    return TaskId(CHIEF, 0) if name == "chief" else TaskId(WORKER, int(name.rsplit("-", 1)[1]))


def tcp_throughput(server: Endpoint, client: Endpoint, seconds: int = 3, port: int = 5201) -> float | None:
    """iperf3 from client to server, bytes/s; None (with a hint) when iperf3 is missing."""

    def cmd(e: Endpoint, *args: str) -> list[str]:
        return (["nsenter", "-t", str(e.netns_pid), "-n"] if e.netns_pid else []) + ["iperf3", *args]

    if subprocess.run(["sh", "-c", "command -v iperf3"], capture_output=True).returncode != 0:
        print("bench-comm: iperf3 not found (apt-get install iperf3): no TCP reference", file=sys.stderr)
        return None
    srv = subprocess.Popen(
        cmd(server, "-s", "-1", "-p", str(port)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(50):  # the server is up within ~0.1 s; it accepts exactly one test (-1)
            r = subprocess.run(
                cmd(client, "-c", server.address, "-p", str(port), "-t", str(seconds), "-J"),
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


# --- Containers of the compose stack (project mwms) ---


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
    started = []

    def cleanup() -> None:
        if started:
            subprocess.run(["docker", "rm", "-f", *started], capture_output=True)

    try:
        for task in containers:
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
        print(
            f"bench-comm: the trainers are not all running: temporary containers from {image} on {network}",
            file=sys.stderr,
        )
        return [_endpoint(t, cid, network) for t, cid in zip(containers, started)], cleanup
    except BaseException:
        cleanup()
        raise


def write_png(table: list[Row], tcp: float | None, n: int, where: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5))
    for variant in dict.fromkeys(r.variant for r in table):
        mine = [r for r in table if r.variant == variant]
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
        ax.set_xticks(
            sorted({r.size for r in table}), [human(s) for s in sorted({r.size for r in table})], rotation=45
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.host.bench_comm", description=__doc__.splitlines()[0])
    p.add_argument(
        "--where",
        choices=("auto", "local", "docker"),
        default="auto",
        help="auto: the compose stack's containers if it exists, else local processes",
    )
    p.add_argument(
        "--project", default=os.environ.get("PROJECT", "mwms"), help="compose project (make up PROJECT=)"
    )
    p.add_argument(
        "--workers", type=int, default=1, help="local: workers besides the chief (default 1: 2 tasks)"
    )
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="bytes, comma-separated")
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help="IMPLEMENTATION/bytes_per_pack, comma-separated"
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path(".run/bench-comm"), help="writes OUT.json and OUT.png")
    args = p.parse_args(argv)
    sizes = [parse_bytes(s) for s in args.sizes.split(",")]
    task_args = [
        "--sizes",
        ",".join(map(str, sizes)),
        "--variants",
        args.variants,
        "--repeats",
        str(args.repeats),
    ]

    where = args.where
    if where == "auto":
        where = "docker" if stack_containers(args.project) else "local"
    cleanup = lambda: None
    if where == "docker":
        endpoints, cleanup = docker_endpoints(args.project)
    else:
        endpoints = local_endpoints(args.workers)
    try:
        print(
            f"bench-comm: {len(endpoints)} tasks ({where}): "
            + ", ".join(f"{e.task}@{e.address}" for e in endpoints),
            file=sys.stderr,
            flush=True,
        )
        tcp = tcp_throughput(endpoints[0], endpoints[1]) if len(endpoints) > 1 else None
        results = _run_sweep(endpoints, task_args)
    finally:
        cleanup()
    n = results[0]["n"]
    table = rows([t for r in results for t in r["timings"]], n)
    print(format_table(table, tcp))
    b = best(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "where": where,
        "n": n,
        "tf_version": results[0]["tf_version"],
        "tcp": tcp,
        "rows": [asdict(r) for r in table],
        "best": {**asdict(b), "ratio_to_tcp": b.busbw / tcp if tcp else None},
    }
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    write_png(table, tcp, n, where, args.out.with_suffix(".png"))
    print(
        f"bench-comm: wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
