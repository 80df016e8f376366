"""The restart budget and the state that outlives the container.

Budget: at most K restarts without a new checkpoint (the step is read from the child's own /metrics,
trainer/supervise/probe.py), so a long job survives any number of faults as long as it keeps saving;
when a retryable exit finds the budget spent the supervisor exits 4 (EXIT_GAVE_UP), a final code for
every engine.

Across container restarts (SUPERVISE_STATE_DIR, a volume): the runs, the budget and a final exit
are kept in `<dir>/<hostname>.json`, the hostname being the container's id, so a new container (`make
up` after `make down`) starts afresh while a restarted one (killed, the engine or the host restarted)
goes on: a restart of the container spends the budget like a restart of the trainer, and a container
whose task ended for good (0, 1, 2, 3 on the first run, 4, 5) exits at once with the same code
without running the task again, whoever starts it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainer.state import atomic


class Budget:
    """K restarts in a row without progress; a checkpoint newer than any seen renews it."""

    def __init__(self, limit: int, used: int = 0, best: int = -1, best_at_restart: int = -1) -> None:
        self.limit, self.used, self.best, self._best_at_restart = limit, used, best, best_at_restart

    def fields(self) -> dict[str, int]:
        return {"used": self.used, "best": self.best, "best_at_restart": self._best_at_restart}

    def saw(self, step: int | None) -> None:
        if step is not None:
            self.best = max(self.best, step)

    def spend(self) -> bool:
        """One restart: False when none is left."""
        if self.best > self._best_at_restart:
            self.used = 0
        self._best_at_restart = self.best
        if self.used >= self.limit:
            return False
        self.used += 1
        return True


@dataclass
class State:
    """What one container's task did, kept across restarts of the container."""

    runs: int = 0
    budget: dict[str, int] = field(default_factory=dict)
    final: int | None = None
    why: str = ""
    stuck: str = ""
    """`<step> <unix time>` the supervisor last ended this task as stuck (errors.STUCK_ENV), or ""."""

    @classmethod
    def load(cls, path: str) -> State:
        try:
            raw = json.loads(Path(path).read_text()) if path else {}
        except FileNotFoundError:
            raw = {}
        except (OSError, ValueError):  # torn or unreadable: the budget restarts, nothing final is lost
            raw = {}
        return cls(**{k: raw[k] for k in ("runs", "budget", "final", "why", "stuck") if k in raw})

    def save(self, path: str) -> None:
        if not path:
            return
        atomic.write_json(
            path, asdict(self)
        )  # whole or not at all: a kill mid-write leaves the previous state
