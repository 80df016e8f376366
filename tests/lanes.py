"""Where `make test`'s side-by-side stage spent its lanes, so that a slow stage says which lane and which
modules made it slow (tests/schedule.py's SECONDS come from this).

Each xdist worker appends one line per test it ran to LOG (lane, unit, start, end: epoch seconds); the
controller prints, at the end, each lane's units in order with their spans and when the lane ended."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

LOG = Path(__file__).resolve().parents[1] / "build" / "logs" / "lanes.tsv"


def record(lane: str, unit: str, start: float, end: float, log: Path = LOG) -> None:
    with log.open("a") as f:  # one short write per test: lines from the lanes do not interleave
        f.write(f"{lane}\t{unit}\t{start:.1f}\t{end:.1f}\n")


def spans(lines: Iterable[str]) -> dict[str, list[tuple[str, float, float]]]:
    """Per lane, its units in the order they started: (unit, first start, last end)."""
    lanes: dict[str, dict[str, list[float]]] = {}
    for line in lines:
        lane, unit, start, end = line.rstrip("\n").split("\t")
        span = lanes.setdefault(lane, {}).setdefault(unit, [float(start), float(end)])
        span[0], span[1] = min(span[0], float(start)), max(span[1], float(end))
    return {
        lane: sorted(((u, s, e) for u, (s, e) in units.items()), key=lambda x: x[1])
        for lane, units in sorted(lanes.items())
    }


def summary(lines: Iterable[str]) -> list[str]:
    """One line per lane: its units, each `name start-end` in seconds from the stage's first test."""
    by_lane = spans(lines)
    if not by_lane:
        return []
    zero = min(s for units in by_lane.values() for _, s, _ in units)
    out = []
    for lane, units in by_lane.items():
        parts = [f"{Path(u).stem.removeprefix('test_')} {s - zero:.0f}-{e - zero:.0f}" for u, s, e in units]
        out.append(f"{lane} ends at {max(e for _, _, e in units) - zero:.0f} s: " + ", ".join(parts))
    return out
