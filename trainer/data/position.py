"""The job's input position: one global example offset, the same at every world size.

Every pipeline reads one job-wide stream and trains its slice of each global batch
(trainer/data/synthetic.py `share`), so where the input stands is the number of examples the job
has consumed, not a per-task count. A manifest records it at its step; a resumed segment goes on
from there with its own global batch. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass
class Position:
    """The offset at `step` (where this segment started) and the global batch it consumes per step."""

    step: int = 0
    offset: int = 0
    global_batch: int = 0

    def at(self, step: int) -> int:
        return self.offset + (step - self.step) * self.global_batch

    def record(self, step: int) -> dict[str, int]:
        """What a manifest keeps: the offset after `step`."""
        return {"offset": self.at(step)}


def saved_offset(body: Mapping | None, global_batch: int | None) -> int:
    """The offset a manifest recorded; one older than resizes trained every step at one global batch."""
    if not body:
        return 0
    if "input" in body:
        return int(body["input"]["offset"])
    return int(body["step"]) * int(global_batch or 0)
