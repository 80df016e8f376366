"""The supervisor's settings: its flags and SUPERVISE_* variables, TF_CONFIG (this task's port and its
peers' /metrics), read once into a frozen `Settings`.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import contract
from trainer.cluster.spec import ClusterSpecError, parse_tf_config
from trainer.supervise.notice import DEFAULT_NOTICE_S, NOTICE_ENV
from trainer.supervise.stall import STALL_ENV, StallBound

DESCRIPTION = "run one task, restart it when that can help (python -m trainer.supervise -- COMMAND ...)"
MAX_RESTARTS_ENV = "SUPERVISE_MAX_RESTARTS"
"""The budget K; the compose generator writes it from MAX_RESTARTS."""
DEFAULT_MAX_RESTARTS = contract.DEFAULT_MAX_RESTARTS
STATE_DIR_ENV = "SUPERVISE_STATE_DIR"
"""Where the state that outlives the container's processes is kept (a volume); unset: nowhere."""
# Restart at once but not in a hot loop: peers need the same ~1 s to notice and exit; the budget,
# not a growing back-off, bounds the retries (a back-off could outgrow the peers' --cluster-timeout).
RESTART_DELAY_S = 1.0
POLL_S = 2.0


@dataclass(frozen=True, kw_only=True)
class Settings:
    command: tuple[str, ...]
    """The task's command (the trainer, or a user's script through trainer.script.wrapper)."""
    max_restarts: int = DEFAULT_MAX_RESTARTS
    """K: restarts allowed in a row without a new checkpoint; a new checkpoint renews the budget."""
    metrics_url: str = f"http://127.0.0.1:{contract.METRICS_PORT}/metrics"
    """The child's /metrics, where its last checkpoint step is read; empty: no progress is ever seen."""
    restart_delay: float = RESTART_DELAY_S
    poll: float = POLL_S
    state_file: str = ""
    """The JSON state of this container's task (SUPERVISE_STATE_DIR/<hostname>.json); empty: not kept."""
    notice_port: int = 0
    """This task's cluster port, where a final exit is announced to peers; 0: no announcement."""
    peers: int = 0
    notice_seconds: float = DEFAULT_NOTICE_S
    stall: StallBound | None = StallBound()
    """When a step that stopped advancing counts as stuck; None: never."""
    task: str = contract.CHIEF
    """This task's name (from TF_CONFIG), in the stuck task's verdict."""
    peer_metrics: tuple[tuple[str, str], ...] = ()
    """(task name, /metrics URL) of every peer, where their input steps are read when the step is stuck."""

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("no command to supervise: python -m trainer.supervise -- python -m trainer ...")
        if self.max_restarts < 0:
            raise ValueError(f"{MAX_RESTARTS_ENV}={self.max_restarts}: must be 0 or more")


def settings_from(argv: Sequence[str], env: Mapping[str, str]) -> Settings:
    p = argparse.ArgumentParser(prog="python -m trainer.supervise", description=DESCRIPTION)
    p.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        help=f"restarts without a new checkpoint (${MAX_RESTARTS_ENV}, default {DEFAULT_MAX_RESTARTS})",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the task's command")
    ns = p.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    raw = (
        ns.max_restarts if ns.max_restarts is not None else env.get(MAX_RESTARTS_ENV) or DEFAULT_MAX_RESTARTS
    )
    try:
        limit = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_RESTARTS_ENV}={raw!r}: must be an integer") from None
    port = env.get("TRAINER_METRICS_PORT", str(contract.METRICS_PORT))
    url = "" if port.strip() in ("", "0") else f"http://127.0.0.1:{port.strip()}/metrics"
    state_dir = env.get(STATE_DIR_ENV, "")
    state_file = os.path.join(state_dir, f"{socket.gethostname()}.json") if state_dir else ""
    try:
        notice = float(env.get(NOTICE_ENV) or DEFAULT_NOTICE_S)
    except ValueError:
        raise ValueError(f"{NOTICE_ENV}={env.get(NOTICE_ENV)!r}: must be a number of seconds") from None
    notice_port, peers = _cluster_port(env.get("TF_CONFIG"))
    task, peer_metrics = _peer_metrics(env.get("TF_CONFIG"), port.strip())
    stall = StallBound.parse(env[STALL_ENV]) if env.get(STALL_ENV) else StallBound()
    return Settings(
        command=tuple(command),
        max_restarts=limit,
        metrics_url=url,
        state_file=state_file,
        notice_port=notice_port,
        peers=peers,
        notice_seconds=notice,
        stall=stall,
        task=task,
        peer_metrics=peer_metrics,
    )


def _peer_metrics(tf_config: str | None, port: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """This task's name and every peer's /metrics URL: the same port at the peer's TF_CONFIG host (true
    of every target; local process clusters differ by port, so their peers read as unknown)."""
    try:
        spec = parse_tf_config(tf_config)
    except ClusterSpecError:
        spec = None
    if spec is None:
        return contract.CHIEF, ()
    if port in ("", "0"):
        return spec.task.name, ()
    urls = tuple((p.name, f"http://{spec.address(p).rpartition(':')[0]}:{port}/metrics") for p in spec.peers)
    return spec.task.name, urls


def _cluster_port(tf_config: str | None) -> tuple[int, int]:
    """This task's cluster port and its number of peers, from TF_CONFIG; (0, 0) without one (the
    trainer itself reports a bad TF_CONFIG, with exit 2)."""
    try:
        spec = parse_tf_config(tf_config)
    except ClusterSpecError:
        return 0, 0
    if spec is None or not spec.peers:
        return 0, 0
    return int(spec.address(spec.task).rpartition(":")[2]), len(spec.peers)
