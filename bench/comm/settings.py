"""What bench-comm A/Bs besides the sweep: gRPC server settings and process environments (the
allocator settings), each on a fresh cluster, in rounds."""

from __future__ import annotations

import json
import os
import sys

from bench.comm.endpoints import Endpoint
from bench.comm.table import merged_rounds
from bench.comm.tasks import _run_sweep, payload_shapes
from trainer.host import server_config

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
