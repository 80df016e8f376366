"""Checkpoints: every task saves (MWMS needs all of them), only the chief writes --checkpoint-dir.

Saving reads sync-on-read variables (BatchNorm statistics) with collectives, so a chief-only save
hangs; the other tasks save into a temporary directory that they delete. On start every task
restores the latest checkpoint it can read, then the chief's variables are broadcast to all, so a
worker without access to the chief's directory still resumes identically. The step counter is
`optimizer.iterations`: it is part of the checkpoint, so a resumed run continues its count.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

import tensorflow as tf

log = logging.getLogger(__name__)
MAX_TO_KEEP = 3


class Checkpointer:
    def __init__(self, directory: str, is_chief: bool, model, optimizer) -> None:
        self._shared = directory
        self._is_chief = is_chief
        self._dir = directory if is_chief else tempfile.mkdtemp(prefix="trainer-ckpt-")
        self._model = model
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        self._manager = tf.train.CheckpointManager(self._checkpoint, self._dir, max_to_keep=MAX_TO_KEEP)

    @property
    def manager(self) -> tf.train.CheckpointManager:
        """This task's manager (the chief's directory, or the private one): the preemption handler saves with it."""
        return self._manager

    def restore(self) -> str | None:
        """Restore the chief's latest checkpoint if this task can read it; its path or None."""
        latest = tf.train.latest_checkpoint(self._shared) if os.path.isdir(self._shared) else None
        if latest:
            self._checkpoint.restore(latest).assert_existing_objects_matched()
        return latest

    def save(self, step: int) -> None:
        self._manager.save(checkpoint_number=step)

    def export(self) -> str:
        """The final model as a SavedModel under <checkpoint-dir>/export (temporary on non-chiefs)."""
        path = os.path.join(self._dir, "export")
        self._model.save(path, include_optimizer=False)
        return path

    def close(self) -> None:
        if not self._is_chief:
            shutil.rmtree(self._dir, ignore_errors=True)


class NoCheckpoints:
    """--checkpoint-dir empty: nothing is saved or restored."""

    def restore(self) -> None:
        return None

    def save(self, step: int) -> None: ...
    def export(self) -> None: ...
    def close(self) -> None: ...


def broadcast_from_chief(strategy, variables) -> None:
    """Make every replica's `variables` equal to the chief's (replica 0), bit for bit.

    An all-reduce SUM where only replica 0 contributes non-zeros: x + 0 is exact.
    """

    @tf.function
    def run():
        def replica():
            ctx = tf.distribute.get_replica_context()
            first = tf.equal(ctx.replica_id_in_sync_group, 0)
            values = [tf.where(first, tf.identity(v), tf.zeros_like(v)) for v in variables]
            out = list(values)
            for dtype in {v.dtype for v in values}:  # a packed all-reduce needs one dtype
                idx = [i for i, v in enumerate(values) if v.dtype == dtype]
                for i, r in zip(idx, ctx.all_reduce(tf.distribute.ReduceOp.SUM, [values[i] for i in idx])):
                    out[i] = r
            return out

        return strategy.run(replica)

    for variable, value in zip(variables, run()):
        variable.assign(strategy.experimental_local_results(value)[0])
