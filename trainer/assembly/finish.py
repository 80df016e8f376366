"""A task's end: the final checkpoint and exported model, the run's record and its copy out of the
checkpoint volume (--export-dir), then this task's summary (--output-dir).
"""

from __future__ import annotations

import dataclasses
import logging
import os

from trainer.assembly.build import Context, Trainable
from trainer.core.timing import LoopResult
from trainer.state import manifest, output, summary
from trainer.state.checkpoint import SaveError

log = logging.getLogger(__name__)


def _copy_out(ctx: Context, final: summary.Summary) -> None:
    """What produced the final model, recorded with it; both copied out of the checkpoint folder (a
    volume `make clean` deletes) when --export-dir is set."""
    config = ctx.config
    body = {
        **dataclasses.asdict(final),
        "steps": config.steps,
        "settings": manifest.job_settings(config, ctx.strategy.num_replicas_in_sync),
        "sizing": ctx.sizing.record(),
    }
    body.pop("example_ids", None)
    try:
        output.record(config.checkpoint_dir, body)
        if not config.export_dir:
            return
        path = output.copy_out(config.checkpoint_dir, config.export_dir)
    except OSError as err:
        raise SaveError(
            f"copying the final model to {config.export_dir} failed ({err}); it is still in "
            f"{config.checkpoint_dir}/export (make output copies it again)"
        ) from None
    log.info(
        "%s: final model in %s, summary in %s",
        ctx.task_id.name,
        path,
        os.path.join(config.export_dir, "summary.json"),
    )


def finish(ctx: Context, job: Trainable, metrics, result: LoopResult) -> None:
    """The final checkpoint and model (chief's directory), then this task's summary."""
    config, name = ctx.config, ctx.task_id.name
    # On every task, at the same point: reading BatchNorm's sync-on-read statistics (the weights'
    # digest) is a collective, and a chief reading them alone waits for peers that have left.
    final = summary.build(name, result, job.task.model.variables)
    if job.ledger is not None:
        job.ledger.flush(result.final_step)
    if config.checkpoint_dir:
        metrics.state("checkpointing")
        if result.final_step > result.start_step:  # a run resumed at its last step has nothing new to save
            job.checkpoints.save(result.final_step)
            job.checkpoints.wait()  # durable (and reported by the checkpoints) before the export and the exit
        else:
            metrics.checkpointed(result.final_step)
        log.info("%s: exported the final model to %s", name, job.checkpoints.export())
        if ctx.is_chief:
            _copy_out(ctx, final)
    job.checkpoints.close()
    if config.output_dir:
        path = summary.write(final, config.output_dir)
        log.info("%s: summary in %s", name, path)
