"""Checkpoints: every task saves (MWMS needs all of them) and keeps its copy; any copy can restore the job.

Saving reads sync-on-read variables (BatchNorm statistics) with collectives, so a chief-only save
hangs. The chief writes --checkpoint-dir itself; every other task writes its own sub-folder
`<checkpoint-dir>/replicas/<task>` (under Compose a tmpfs of its container; on Swarm the node's
volume), kept across restarts and bounded by the manager's MAX_TO_KEEP. Replicas are identical, so
no task holds the only copy: at start each task finds the newest intact copy it can read (its own
folder first, then the chief's and every task's sub-folder on its volume), the tasks agree which of
them holds the newest step (an all-gather; the chief on a tie), that task restores, and its
variables (and the learning rate) are broadcast to all, so every task resumes identically. A lost
chief's volume then costs only what the surviving copies lack. The step counter is
`optimizer.iterations`.

Integrity (trainer/state/manifest.py): a save is written, flushed, then published by a manifest. On start
the chief restores the newest checkpoint whose files match their manifest, after one warning line
per newer one it skips; a save that fails (a full disk) leaves the previous one
intact and ends the task with one line.

Off the step path (`asynchronous`, what training uses): TensorFlow's asynchronous checkpointing copies
every variable to host memory in one compiled function (a collective on every task: it reads the
sync-on-read BatchNorm statistics) and returns; its writer thread writes the files, then runs the
manager's write callbacks, the first of which is ours: flush the files, write the manifest. So the
manifest names only a save whose files are whole and durable, exactly as a synchronous save's does.
At most one save is in flight: the next one, the end of the job, a preemption (TensorFlow syncs
before its own save) and a task leaving on an error all wait for it first (`wait`, `settle`).
Measured on the cnn task (docs/faults.md): a synchronous save held the loop ~130 ms, 70 % of it in
24 eager all-reduces of the BatchNorm statistics; the hand-off holds it 10-30 ms (chief + 1 worker),
up to ~0.12 s with three tasks on a loaded machine (most of it waiting in the copy's collective).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import tensorflow as tf

from trainer.errors import ConfigError, TrainerError
from trainer.state import manifest, output

log = logging.getLogger(__name__)
MAX_TO_KEEP = 3
PEER_LOST = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
    tf.errors.DeadlineExceededError,
)
"""What a dead peer looks like from a survivor: the collective is aborted, sticky for the process. A
save reads sync-on-read variables with collectives, so a peer lost during a save fails it this way too."""
SETTLE_SECONDS = 30.0
"""How long a task leaving on an error waits for its save in flight (a write takes ~0.1 s; compose
gives a stopped task 60 s). A write stuck longer is abandoned: it has no manifest, so it never counts."""
REPLICAS = "replicas"
"""The sub-folder of --checkpoint-dir holding each non-chief's own copy, one folder per task name."""


class SaveError(TrainerError):
    """A save that could not be written (a full disk, a read-only volume): permanent, exit 1."""


def task_dir(shared: str, task_name: str, is_chief: bool) -> str:
    """Where this task saves its copy: the chief in --checkpoint-dir itself (what `make up` checks and
    `make output` copies from), every other task in its own sub-folder."""
    return shared if is_chief else os.path.join(shared, REPLICAS, task_name)


def copies(shared: str, own: str) -> list[str]:
    """Every folder that may hold a copy of this job's checkpoints, `own` first: the chief's, then each
    task's sub-folder (on Swarm, one node's volume holds whichever tasks ran there)."""
    base = os.path.join(shared, REPLICAS)
    try:
        others = sorted(os.path.join(base, n) for n in os.listdir(base))
    except OSError:
        others = []
    return list(dict.fromkeys([own, shared, *(o for o in others if os.path.isdir(o))]))


def holder(rows: list[list[float]]) -> int | None:
    """The replica (row of an all-gather of each task's newest step, -1 for none) whose task restores:
    the newest step, the first replica (the chief's) on a tie; None when no task has a checkpoint."""
    best = max(range(len(rows)), key=lambda i: (rows[i][0], -i), default=None)
    return best if best is not None and rows[best][0] >= 0 else None


def copy_lags(rows: list[list[float]], step: int) -> bool:
    """Whether some task's own folder lacks the step the job resumes at (column 2 of the agreement's
    rows: each task's own newest intact step, -1 for none), so every task saves it again at once.
    Without it, a step restored from another task's copy lived only there: the chief killed mid-save
    of 850 resumed at 850 from a worker's copy on its container's tmpfs, then `docker kill` of every
    task emptied that tmpfs and the chief's folder, whose 850 was never finished, gave 800 (issue 29)."""
    return step > 0 and any(row[2] < step for row in rows)


def newest_manifest(shared: str, task_name: str, is_chief: bool) -> dict | None:
    """The manifest of the newest intact copy a task can read, before its Checkpointer exists: what
    sizes a resumed segment (trainer/state/resize.py)."""
    found = manifest.newest([manifest.scan(f) for f in copies(shared, task_dir(shared, task_name, is_chief))])
    return manifest.read(found.prefix) if found.prefix else None


def private_dir(shared: str, task_name: str) -> str:
    """A non-chief's scratch folder for the final export (the SavedModel only the chief keeps)."""
    job = hashlib.sha256(os.path.abspath(shared).encode()).hexdigest()[:10]
    return os.path.join(tempfile.gettempdir(), f"trainer-ckpt-{task_name}-{job}")


class _PublishingManager(tf.train.CheckpointManager):
    """TensorFlow's manager, whose every save (ours, and the preemption handler's) is then published:
    by a write callback, which TensorFlow runs once the files are written (in its writer thread when
    the save is asynchronous, before the manager records and sweeps)."""

    def __init__(self, checkpoint, directory, settings: Mapping[str, object] | None, hooks: Hooks) -> None:
        super().__init__(checkpoint, directory, max_to_keep=MAX_TO_KEEP)
        self._settings = settings
        self._hooks = hooks
        self.asynchronous = False

    def save(self, checkpoint_number=None, check_interval=True, options=None):
        if self._settings is None:
            return super().save(
                checkpoint_number=checkpoint_number, check_interval=check_interval, options=options
            )
        step = int(checkpoint_number)
        publish = _Publication(
            self.directory, step, self._settings, dict(self._hooks.extra(step)), self._hooks
        )
        options = tf.train.CheckpointOptions(
            experimental_enable_async_checkpoint=self.asynchronous, experimental_write_callbacks=[publish]
        )
        return super().save(checkpoint_number=step, check_interval=check_interval, options=options)


@dataclass(frozen=True)
class Hooks:
    """What a Checkpointer is told and calls, besides TensorFlow: what a manifest records besides the
    settings (`extra(step)`, taken when the save is handed off), who hears that a step is durable, and
    a test-only hook run just before a manifest is written (--fault TASK:save-block@STEP)."""

    extra: Callable[[int], Mapping] = lambda step: {}
    durable: Callable[[int], None] = lambda step: None
    before_publish: Callable[[int], None] = lambda step: None


@dataclass(frozen=True)
class _Publication:
    """The write callback of one save: its files are written; flush them and write the manifest."""

    directory: str
    step: int
    settings: Mapping[str, object]
    extra: Mapping
    hooks: Hooks = field(repr=False)

    def __call__(self, save_path: str) -> None:
        self.hooks.before_publish(self.step)
        _drop_orphan_manifests(self.directory)  # what earlier sweeps left (the manager sweeps after us)
        manifest.publish(save_path, self.step, self.settings, self.extra)
        self.hooks.durable(self.step)


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
class Record:
    """What each manifest of this job records: the job settings (checked at a resume) and `extra(step)`,
    the rest of what the step is (the input offset, the sizing: trainer/state/resize.py); how a save is
    written and who hears of it."""

    settings: Mapping[str, object]
    extra: Callable[[int], Mapping] | None = None
    asynchronous: bool = False
    """Saves hand off to TensorFlow's writer thread (training); else each save is written and published
    before `save` returns."""
    durable: Callable[[int], None] | None = None
    """Told each step once its manifest is written (the task's trainer_last_checkpoint_step)."""
    before_publish: Callable[[int], None] | None = None
    """Test-only: runs in the writer just before a manifest (--fault TASK:save-block@STEP)."""

    def hooks(self) -> Hooks:
        given = {"extra": self.extra, "durable": self.durable, "before_publish": self.before_publish}
        return Hooks(**{k: v for k, v in given.items() if v is not None})


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
        settings: Mapping[str, object] | Record,
        accept_new_settings: bool = False,
    ) -> None:
        record = settings if isinstance(settings, Record) else Record(settings)
        settings = record.settings
        directory, task_name, is_chief = place.directory, place.task_name, place.is_chief
        self._shared = directory
        self._is_chief = is_chief
        self._model = model
        self._optimizer = optimizer
        self._accept_new = accept_new_settings
        self._task = task_name
        self._dir = task_dir(directory, task_name, is_chief)
        os.makedirs(self._dir, exist_ok=True)
        self._found = self._scan(settings, accept_new_settings)
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        self._manager = _PublishingManager(self._checkpoint, self._dir, dict(settings), record.hooks())
        self._manager.asynchronous = record.asynchronous
        self._in_flight: int | None = None
        """The step handed to the writer and not yet waited for."""

    def _scan(self, settings, accept_new_settings: bool) -> manifest.Scan:
        own = manifest.scan(self._dir)
        for line in own.skipped:  # kept for a post-mortem; the next save of that step replaces it
            log.warning("%s", line)
        _write_state(self._dir, own.intact)
        self._own_step = own.step
        others = [manifest.scan(folder) for folder in copies(self._shared, self._dir)[1:]]
        return manifest.fits(manifest.newest([own, *others]), settings, accept_new_settings)

    @property
    def newest_step(self) -> int | None:
        """The step of the newest intact copy this task can read (None: none), for the agreement on who restores."""
        return self._found.step

    @property
    def newest_manifest(self) -> dict | None:
        """The manifest of the newest intact copy this task can read (None: none): its input offset."""
        return manifest.read(self._found.prefix) if self._found.prefix else None

    @property
    def own_step(self) -> int | None:
        """The step of the newest intact copy in this task's own folder (None: none): what it keeps."""
        return self._own_step

    @property
    def manager(self) -> tf.train.CheckpointManager:
        """This task's manager (the chief's directory, or the private one): the preemption handler saves with it."""
        return self._manager

    def restore(self) -> str | None:
        """Restore the newest intact copy this task found (its path, or None). Called on the task the
        cluster agreed on (`holder`); the others take its values from the broadcast that follows."""
        if self._found.prefix is None:
            return None
        try:
            self._checkpoint.restore(self._found.prefix).expect_partial()
            # What must match: the model, and the optimizer unless the settings changed (a rate variable
            # instead of a schedule). Not the preemption handler's run counter, which it attaches to the
            # checkpoint after TensorFlow's asynchronous writer copied the checkpoint's objects (so
            # asynchronous saves lack it): every task restarts that counter from 0 anyway.
            must = (
                {"model": self._model}
                if self._accept_new
                else {"model": self._model, "optimizer": self._optimizer}
            )
            tf.train.Checkpoint(**must).restore(self._found.prefix).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as err:
            raise ConfigError(
                f"checkpoint {self._found.prefix} does not fit this model ({str(err).splitlines()[0][:200]}): "
                "start over with `make clean` (or an empty --checkpoint-dir)"
            ) from None
        return self._found.prefix

    def save(self, step: int) -> None:
        """Save `step`: published before returning, or (asynchronous) handed to the writer once the
        previous save is durable. Every task calls it at the same step (the copy is a collective)."""
        self.wait()
        try:
            self._manager.save(checkpoint_number=step)
        except (
            PEER_LOST
        ):  # not the disk: a peer was lost mid-save (retryable, exit 200); no manifest, no checkpoint
            _remove(os.path.join(self._dir, f"ckpt-{step}"))
            raise
        except (tf.errors.OpError, OSError) as err:
            raise self._failed(f"saving checkpoint step {step}", step, err) from None
        if self._manager.asynchronous:
            self._in_flight = step

    def wait(self) -> None:
        """Until the save in flight (if any) is durable: its manifest written. Its write's error (a full
        disk) is raised here, naming its step, as a synchronous save's would be."""
        step, self._in_flight = self._in_flight, None
        if step is None:
            return
        self._checkpoint.sync()
        # TensorFlow keeps its writer's error until its next save: take it here, for the step it belongs to.
        writer = self._checkpoint._async_checkpointer_impl  # noqa: SLF001 (no public accessor in 2.21)
        err, writer._async_error = writer._async_error, None  # noqa: SLF001
        if err is not None:
            raise self._failed(f"saving checkpoint step {step}", step, err) from None
        _drop_orphan_manifests(self._dir)

    def settle(self, timeout: float = SETTLE_SECONDS) -> None:
        """A task leaving on an error (a lost peer, a preemption) lets its save in flight finish, so
        the newest save it handed off still counts; bounded, and any error of it only logged."""
        if self._in_flight is None:
            return
        done = threading.Event()

        def waiting() -> None:
            try:
                self.wait()
            except (TrainerError, tf.errors.OpError, OSError) as err:
                log.warning("%s: the save in flight failed while leaving: %s", self._task, err)
            finally:
                done.set()

        threading.Thread(target=waiting, daemon=True, name="settle-save").start()
        if not done.wait(timeout):
            log.warning(
                "%s: the save in flight did not finish within %.0fs: left unpublished", self._task, timeout
            )

    def export(self) -> str:
        """The final model as a SavedModel under <checkpoint-dir>/export (temporary on non-chiefs)."""
        folder = self._dir if self._is_chief else private_dir(self._shared, self._task)
        path = os.path.join(folder, output.EXPORT)
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
        self.wait()
        if not self._is_chief:  # the scratch export; the task's checkpoint copy stays
            shutil.rmtree(private_dir(self._shared, self._task), ignore_errors=True)


@dataclass(frozen=True)
class NoCheckpoints:
    """--checkpoint-dir empty: nothing is saved or restored (a save's step is still reported, as before)."""

    durable: Callable[[int], None] = lambda step: None
    newest_step = None
    newest_manifest = None
    own_step = None

    def restore(self) -> None:
        return None

    def save(self, step: int) -> None:
        self.durable(step)

    def wait(self) -> None: ...
    def settle(self) -> None: ...
    def export(self) -> None: ...
    def close(self) -> None: ...


def broadcast_from(strategy, variables, source: int = 0) -> None:
    """Make every replica's `variables` equal to replica `source`'s (0: the chief's), bit for bit.

    An all-reduce SUM where only the source replica contributes non-zeros: x + 0 is exact.
    """

    @tf.function(autograph=False)  # Python loops over Python lists only: nothing to convert
    def run():
        def replica():
            ctx = tf.distribute.get_replica_context()
            first = tf.equal(ctx.replica_id_in_sync_group, source)
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
