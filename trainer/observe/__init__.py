"""A user's unmodified MWMS script, observed: the contract's per-step metrics without editing it.

`install` (trainer/script/wrapper.py calls it before running the script) wraps tf-keras' Model.fit
(fit.py) and every tf.function call and Strategy.run (loop.py), so both training styles report each
call of their step function to one Recorder (record.py); it wraps MWMS's all-reduce and the
distributed iterator (marks.py), so every step's graph measures its own all-reduce and input wait;
and it starts the Sampler (sampler.py), whose profiler windows (off unless TRAINER_SPLIT_PERIOD_S)
split the steps nothing marks (XLA-compiled) and check the marks (TRAINER_SPLIT_CHECK). docs/script.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.observe.sampler import Sampler
    from trainer.telemetry.metrics import Metrics


def install(metrics: Metrics, env: Mapping[str, str]) -> Sampler:
    """Hooks in, sampler started; `close()` it when the script has returned. Imported here, not at the
    top: the stack's emitter (a bare python3) reads trainer.observe.config without prometheus_client."""
    from trainer.observe import config, fit, loop, marks
    from trainer.observe.record import Recorder
    from trainer.observe.sampler import Sampler

    settings = config.from_env(env)
    # No target from TRAINER_STEPS: the stack sets it (make up's default) whether or not the script
    # reads it, so a script's progress would be another number (issue 29). fit.py sets fit's own.
    recorder = Recorder(metrics)
    if settings.marks:
        marks.install(recorder.marks)
    fit.install(recorder)
    loop.install(recorder)
    sampler = Sampler(recorder, settings)
    sampler.start()
    return sampler
