"""The JSON summary each task writes to --output-dir at the end: what the cluster tests compare.

`weights_sha256` hashes every model variable's bytes in order: equal digests mean bit-identical
replicas. `example_ids` (sorted, omitted past MAX_IDS) and their digest show which examples the
task's replicas trained on, so tests can check that tasks saw disjoint examples.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from trainer.state import atomic

if TYPE_CHECKING:
    from trainer.core.timing import LoopResult

MAX_IDS = 200_000


@dataclass(frozen=True, kw_only=True)
class Summary:
    task: str
    start_step: int
    final_step: int
    loss: float
    accuracy: float | None
    weights_sha256: str
    examples: int
    example_ids_sha256: str
    example_ids: list[int] | None


def weights_digest(variables) -> str:
    h = hashlib.sha256()
    for v in variables:
        h.update(np.ascontiguousarray(v.numpy()).tobytes())
    return h.hexdigest()


def build(task: str, result: LoopResult, variables) -> Summary:
    """`result`: the loop's, whose `ids` are the example ids of each call."""
    ids = result.ids
    all_ids = np.sort(np.concatenate(ids)) if ids else np.zeros(0, np.int64)
    return Summary(
        task=task,
        start_step=result.start_step,
        final_step=result.final_step,
        loss=result.loss,
        accuracy=result.accuracy,
        weights_sha256=weights_digest(variables),
        examples=int(all_ids.size),
        example_ids_sha256=hashlib.sha256(all_ids.astype("<i8").tobytes()).hexdigest(),
        example_ids=all_ids.tolist() if all_ids.size <= MAX_IDS else None,
    )


def write(summary: Summary, output_dir: str) -> str:
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, f"{summary.task}.json")
    return atomic.write_json(path, asdict(summary))  # readers never see a half-written file
