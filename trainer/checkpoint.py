"""Checkpoints: every task saves (MWMS needs all of them), only the chief writes --checkpoint-dir.

Saving reads sync-on-read variables (BatchNorm statistics) with collectives, so a chief-only save
hangs; the other tasks save into a private folder, one per task and job (emptied at every start and
removed at the end, so restarts do not pile copies up in a RAM-backed /tmp). Only the chief restores;
its variables (and the learning rate) are then broadcast to all, so every task resumes identically
whether or not it can read the chief's folder. The step counter is `optimizer.iterations`.

Integrity (trainer/manifest.py): a save is written, flushed, then published by a manifest. On start
the chief restores the newest checkpoint whose files match their manifest, after one warning line
per newer one it skips; a save that fails (a full disk) leaves the previous one
intact and ends the task with one line.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass

import tensorflow as tf

from trainer import manifest, output
from trainer.errors import ConfigError, TrainerError

log = logging.getLogger(__name__)
MAX_TO_KEEP = 3


class SaveError(TrainerError):
    """A save that could not be written (a full disk, a read-only volume): permanent, exit 1."""


def private_dir(shared: str, task_name: str) -> str:
    """A non-chief's folder: the same on every restart of this task of this job, so it is reused."""
    job = hashlib.sha256(os.path.abspath(shared).encode()).hexdigest()[:10]
    return os.path.join(tempfile.gettempdir(), f"trainer-ckpt-{task_name}-{job}")


class _PublishingManager(tf.train.CheckpointManager):
    """TensorFlow's manager, whose every save (ours, and the preemption handler's) is then published."""

    def __init__(self, checkpoint, directory, settings: Mapping[str, object] | None) -> None:
        super().__init__(checkpoint, directory, max_to_keep=MAX_TO_KEEP)
        self._settings = settings

    def save(self, checkpoint_number=None, check_interval=True, options=None):
        prefix = super().save(
            checkpoint_number=checkpoint_number, check_interval=check_interval, options=options
        )
        if prefix and self._settings is not None:
            manifest.publish(prefix, int(checkpoint_number), self._settings)
            _drop_orphan_manifests(self.directory)
        return prefix


def _drop_orphan_manifests(directory: str) -> None:
    """Manifests of checkpoints TensorFlow's manager swept away (it only knows its own files)."""
    for step in manifest.steps_in(directory):
        prefix = os.path.join(directory, f"ckpt-{step}")
        if not manifest.files_of(prefix):
            for leftover in (manifest.manifest_path(prefix), manifest.manifest_path(prefix) + ".tmp"):
                if os.path.exists(leftover):
                    os.remove(leftover)


def _remove(prefix: str) -> None:
    for path in [*manifest.files_of(prefix), manifest.manifest_path(prefix)]:
        if os.path.exists(path):
            os.remove(path)
    shutil.rmtree(prefix + "_temp", ignore_errors=True)


def _write_state(directory: str, intact: tuple[str, ...]) -> None:
    """TensorFlow's `checkpoint` file, rewritten to list what is intact (an empty or garbled one
    otherwise makes its manager fail or forget the checkpoints it should sweep). Private API: the
    public one is deprecated and writes no timestamps, which makes the manager keep them forever."""
    from tensorflow.python.checkpoint import checkpoint_management

    state = os.path.join(directory, "checkpoint")
    if not intact:
        if os.path.exists(state):
            os.remove(state)
        return
    now = time.time()
    checkpoint_management.update_checkpoint_state_internal(
        save_dir=directory,
        model_checkpoint_path=intact[-1],
        all_model_checkpoint_paths=list(intact),
        all_model_checkpoint_timestamps=[now] * len(intact),
        last_preserved_timestamp=now - 1,
        save_relative_paths=True,
    )


@dataclass(frozen=True)
class Place:
    """Where one task keeps checkpoints: the shared folder (the chief's), and who is asking."""

    directory: str
    task_name: str
    is_chief: bool


class Checkpointer:
    def __init__(
        self,
        place: Place,
        model,
        optimizer,
        settings: Mapping[str, object],
        accept_new_settings: bool = False,
    ) -> None:
        directory, task_name, is_chief = place.directory, place.task_name, place.is_chief
        self._shared = directory
        self._is_chief = is_chief
        self._model = model
        self._accept_new = accept_new_settings
        self._found = None
        if is_chief:
            os.makedirs(directory, exist_ok=True)
            self._found = self._scan(settings, accept_new_settings)
            self._dir = directory
        else:
            self._dir = private_dir(directory, task_name)
            shutil.rmtree(self._dir, ignore_errors=True)  # what a killed run of this task left
            os.makedirs(self._dir)
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        self._manager = _PublishingManager(self._checkpoint, self._dir, dict(settings) if is_chief else None)

    def _scan(self, settings, accept_new_settings: bool) -> manifest.Scan:
        found = manifest.check(self._shared, settings, accept_new_settings)
        for line in found.skipped:  # kept for a post-mortem; the next save of that step replaces it
            log.warning("%s", line)
        _write_state(self._shared, found.intact)
        return found

    @property
    def manager(self) -> tf.train.CheckpointManager:
        """This task's manager (the chief's directory, or the private one): the preemption handler saves with it."""
        return self._manager

    def restore(self) -> str | None:
        """The chief restores the newest intact checkpoint (its path, or None); the others take its
        values from the broadcast that follows."""
        if self._found is None or self._found.prefix is None:
            return None
        try:
            status = self._checkpoint.restore(self._found.prefix)
            if self._accept_new:  # the optimizer may differ (a rate variable instead of a schedule)
                status.expect_partial()
                tf.train.Checkpoint(model=self._model).restore(
                    self._found.prefix
                ).assert_existing_objects_matched()
            else:
                status.assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as err:
            raise ConfigError(
                f"checkpoint {self._found.prefix} does not fit this model ({str(err).splitlines()[0][:200]}): "
                "start over with `make clean` (or an empty --checkpoint-dir)"
            ) from None
        return self._found.prefix

    def save(self, step: int) -> None:
        try:
            self._manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as err:
            raise self._failed(f"saving checkpoint step {step}", step, err) from None

    def export(self) -> str:
        """The final model as a SavedModel under <checkpoint-dir>/export (temporary on non-chiefs)."""
        path = os.path.join(self._dir, output.EXPORT)
        if self._is_chief:
            output.forget_copy(self._dir)
        try:
            self._model.save(path, include_optimizer=False)
        except (tf.errors.OpError, OSError) as err:
            raise self._failed("exporting the final model", None, err) from None
        return path

    def _failed(self, what: str, step: int | None, err: Exception) -> SaveError:
        if step is not None:
            _remove(os.path.join(self._dir, f"ckpt-{step}"))  # the partial files, so the space is free again
        previous = self._manager.latest_checkpoint
        reason = (getattr(err, "message", None) or str(err)).splitlines()[0][:200]
        return SaveError(
            f"{what} to {self._dir} failed ({type(err).__name__}: {reason}); "
            + (
                f"the previous checkpoint {previous} is intact"
                if previous
                else "no earlier checkpoint exists"
            )
            + ": free space (or fix the volume) and restart to resume from it"
        )

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
