"""The fault-injection hook of the stuck-task tests (--fault, docs/faults.md): not a setting.

    --fault TASK:input-block@STEP   that task's input never delivers the batch of STEP
    --fault TASK:hang@STEP          once that task's step reaches STEP its host loop stops before the
                                    next call: it never enters the next collective
    --fault TASK:save-block@STEP    that task's checkpoint writer blocks on the save of STEP (or the
                                    first past it) after its files, before its manifest: a kill
                                    mid-save, on purpose (tests/cluster/test_kill_mid_async_save.py)

Either way the process stays alive and heartbeats (TensorFlow's coordination agent is a thread of
its own), so nothing but trainer.supervise.supervisor's stall bound ends the job: what a hung input pipeline
or a deadlocked host thread does. A fault fires once per container (a marker in the container's
/tmp): the run that the supervisor starts after it trains through. Every task gets the same
value and only the task it names acts on it. Standard library only.

Here the fault itself: what --fault names, parsed where the config checks it, and its firing;
trainer/train/fault.py puts it into the input pipeline or the host loop.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import ConfigError

log = logging.getLogger(__name__)
KINDS = ("input-block", "hang", "save-block")
FLAG = "--fault (TRAINER_FAULT)"


@dataclass(frozen=True)
class Fault:
    task: str
    kind: str
    step: int
    marker_dir: str = tempfile.gettempdir()

    @classmethod
    def parse(cls, text: str) -> Fault | None:
        """`TASK:KIND@STEP`, or None for an empty value."""
        if not text.strip():
            return None
        task, _, rest = text.strip().partition(":")
        kind, _, step = rest.partition("@")
        if not task or kind not in KINDS or not step.isdigit() or int(step) < 1:
            raise ConfigError(
                f"{FLAG}={text!r}: must be TASK:KIND@STEP with KIND one of {', '.join(KINDS)} "
                "(e.g. worker-1:input-block@40)"
            )
        return cls(task, kind, int(step))

    def armed(self, task: str, kind: str) -> bool:
        """This task's fault of this kind, not yet fired in this container."""
        return self.task == task and self.kind == kind and not self._marker.exists()

    def fire(self, step: int) -> None:
        """Mark the fault fired (the next run trains through), say so, and block this thread for ever."""
        self._marker.touch()
        log.warning(
            "%s: fault injected (%s): %s at step %d, blocking for ever", self.task, FLAG, self.kind, step
        )
        threading.Event().wait()

    @property
    def _marker(self) -> Path:
        return Path(self.marker_dir) / f"trainer-fault-{self.task}-{self.kind}-{self.step}"


def of(text: str, task: str, kind: str) -> Fault | None:
    """The fault `text` names for this task and kind, if armed."""
    fault = Fault.parse(text)
    return fault if fault is not None and fault.armed(task, kind) else None
