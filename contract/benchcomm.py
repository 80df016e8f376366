"""The result file of `make bench-comm`: written by the bench-comm driver, read by `make diagnose`.

Standard library only. Both sides import this module, so the file's layout is written once:

    result = Result(where=..., n=2, tf_version=..., tcp=..., rows=(Row(...), ...))
    result.write(path)                       # the driver
    Result.read(path).reference(grad_bytes)  # diagnose: (busbw, size) nearest the gradients
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

SCHEMA = 1
"""Bumped when a field changes meaning; readers refuse other versions with one line."""


class ResultError(ValueError):
    """The file is not a bench-comm result this code can read; the message says why and what to do."""


@dataclass(frozen=True)
class Row:
    variant: str
    """The knob setting, e.g. `RING/1MiB` (implementation / bytes per pack)."""
    size: int
    """Bytes all-reduced per call (the whole payload)."""
    seconds: float
    """Median time of one all-reduce, slowest task."""
    algbw: float
    """size / seconds, bytes/s."""
    busbw: float
    """algbw x 2(n-1)/n (nccl-tests), bytes/s."""
    payload: str = "equal8"
    """The tensor list all-reduced: `equal8` (8 equal tensors) or a model's gradient shapes."""
    seconds_min: float | None = None
    """Fastest and slowest repeat (each the slowest task's), around the median `seconds`."""
    seconds_max: float | None = None


@dataclass(frozen=True)
class Result:
    where: str
    """`containers of <project>` or `local processes`."""
    n: int
    """Tasks in the all-reduce."""
    tf_version: str
    tcp: float | None
    """iperf3 TCP bytes/s between the first two tasks; None when not measured."""
    rows: tuple[Row, ...]

    @property
    def best(self) -> Row:
        """The knob setting with the highest busbw at the largest size."""
        largest = max(r.size for r in self.rows)
        return max((r for r in self.rows if r.size == largest), key=lambda r: r.busbw)

    def reference(self, gradient_bytes: float | None) -> tuple[float, int]:
        """(busbw, size): the best busbw at the size nearest `gradient_bytes` (log scale), or the
        overall best when the gradients' size is unknown."""
        if not gradient_bytes:
            return self.best.busbw, self.best.size
        size = min({r.size for r in self.rows}, key=lambda s: abs(math.log(s / gradient_bytes)))
        return max(r.busbw for r in self.rows if r.size == size), size

    def to_dict(self) -> dict:
        best = self.best
        return {
            "schema": SCHEMA,
            "where": self.where,
            "n": self.n,
            "tf_version": self.tf_version,
            "tcp": self.tcp,
            "rows": [asdict(r) for r in self.rows],
            "best": {**asdict(best), "ratio_to_tcp": best.busbw / self.tcp if self.tcp else None},
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: dict) -> Result:
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            found = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise ResultError(f"schema {found!r}, this code reads {SCHEMA}: run `make bench-comm` again")
        try:
            rows = tuple(Row(**r) for r in data["rows"])
            result = cls(
                where=data["where"],
                n=int(data["n"]),
                tf_version=data["tf_version"],
                tcp=data["tcp"],
                rows=rows,
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ResultError(f"malformed ({err!r}): run `make bench-comm` again") from None
        if not rows:
            raise ResultError("no rows: run `make bench-comm` again")
        return result

    @classmethod
    def read(cls, path: Path) -> Result:
        """Raises FileNotFoundError when bench-comm has not run, ResultError when the file is unusable."""
        try:
            data = json.loads(path.read_text())
        except ValueError as err:
            raise ResultError(f"{path}: not JSON ({err}): run `make bench-comm` again") from None
        try:
            return cls.from_dict(data)
        except ResultError as err:
            raise ResultError(f"{path}: {err}") from None
