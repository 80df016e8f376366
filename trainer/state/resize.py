"""A job resumed at another world size: what its batch and learning rate become, and the one line saying so.

A synchronous job can change size only at a checkpoint: its variables do not depend on the number
of replicas, but the global batch, the learning rate and the meaning of the input position do. The
policy (`--resize-keep`, `make ... RESIZE_KEEP=`):

- `per-replica-batch` (default): every replica keeps its batch, the global batch follows the world
  size, and the rate is rescaled by the rule the job started with (`--lr-scaling`);
- `global-batch`: the global batch of the checkpoint is kept, split anew over the replicas (refused
  in one line when it does not divide), so the rate stays.

The rate is always `--learning-rate` times (global batch / `--per-replica-batch`) under
`--lr-scaling linear`: the rule of the start, applied to the batch trained now. The warm-up is not
repeated: it follows the step counter, which a resize continues. No TensorFlow; trainer/config.py names
the policies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from trainer.config import RESIZE_KEEPS as KEEPS
from trainer.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Sizing:
    """The batch one segment of a job trains with, on `replicas` replicas."""

    replicas: int
    per_replica_batch: int
    """What each replica trains on per step in this segment."""
    reference_batch: int
    """--per-replica-batch: the batch --learning-rate is given for."""
    keep: str
    """The resize policy (KEEPS)."""

    @property
    def global_batch(self) -> int:
        return self.replicas * self.per_replica_batch

    @property
    def lr_scale(self) -> float:
        """The factor --lr-scaling linear applies to --learning-rate: the global batch in reference batches."""
        return self.global_batch / self.reference_batch

    def record(self) -> dict[str, object]:
        """What a manifest keeps of it (with the global batch, which a later global-batch resize keeps)."""
        return {**asdict(self), "global_batch": self.global_batch}


def saved(body: Mapping | None) -> Sizing | None:
    """The sizing a checkpoint's manifest recorded (None: no checkpoint). A manifest older than resizes
    recorded the replicas and the per-replica batch among its settings."""
    if not body:
        return None
    if "sizing" in body:
        return Sizing(**{k: v for k, v in body["sizing"].items() if k != "global_batch"})
    settings = body.get("settings", {})
    if settings.get("replicas") is None or settings.get("per_replica_batch") is None:
        return None
    per = int(settings["per_replica_batch"])
    return Sizing(
        replicas=int(settings["replicas"]), per_replica_batch=per, reference_batch=per, keep=KEEPS[0]
    )


def plan(*, replicas: int, per_replica_batch: int, keep: str, before: Sizing | None) -> Sizing:
    """This segment's sizing: `per_replica_batch` is the flag, `before` the checkpoint's (None: a new job)."""
    if keep not in KEEPS:
        raise ConfigError(f"--resize-keep {keep!r}: must be one of {', '.join(KEEPS)}")
    mine = Sizing(
        replicas=replicas, per_replica_batch=per_replica_batch, reference_batch=per_replica_batch, keep=keep
    )
    if before is None or keep == "per-replica-batch":
        return mine
    total = before.global_batch
    if total % replicas:
        raise ConfigError(
            f"RESIZE_KEEP=global-batch: the global batch {total} does not divide over {replicas} replicas "
            f"(a world size dividing {total}, or RESIZE_KEEP=per-replica-batch)"
        )
    return dataclasses.replace(mine, per_replica_batch=total // replicas)


def rate(learning_rate: float, lr_scaling: str, sizing: Sizing) -> float:
    """The rate after warm-up: the rule of the start (`--lr-scaling`) applied to this segment's batch."""
    return learning_rate * sizing.lr_scale if lr_scaling == "linear" else learning_rate


def change(before: Sizing, now: Sizing, step: int, rates: tuple[float, float]) -> str | None:
    """The one line a resize prints (None: the size did not change)."""
    if before.replicas == now.replicas and before.per_replica_batch == now.per_replica_batch:
        return None
    return (
        f"resized at step {step}: {before.replicas} -> {now.replicas} replicas, global batch "
        f"{before.global_batch} -> {now.global_batch} ({now.replicas} x {now.per_replica_batch}), "
        f"peak lr {rates[0]:g} -> {rates[1]:g} (RESIZE_KEEP={now.keep}, warm-up not repeated)"
    )
