"""The winner file: where `make tune` writes the best setting it measured and `make up` reads it
(compose/up.sh: a setting given on make's command line wins over the file; `make up` says it used it
and how to undo it). One `NAME=value` line per setting under a comment saying what was measured; the
measured figures also go to tune.json beside it, which `make diagnose` cites.

A second winner keeps the settings of the first that it does not set itself, and says so in one line:
the second tune measured its winner against the job as it ran, and `make up` (and APPLY=1) had started
that job with the first winner's settings, so what was measured is both; dropping the first's would
start the next job at a combination no tune measured and silently undo a measured gain. A setting both
set takes the second's value (measured on top of the first's). The file's comments keep each winner's
line; undo is still deleting the file."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path

from monitoring.tune.table import Row

FILE = "tuned.env"
RESULT = "tune.json"
JOB_SETTING = "RESUME_NEW_SETTINGS"
"""Set with a winner that changes a job setting: the checkpoint's own would refuse it."""


EARLIER = "# earlier winner: "
"""The comment that keeps an earlier winner's line in the file while any of its settings is kept."""
UNDO = "# make up reads this file; undo: delete it (or give the setting on make's command line)"


def lines(
    settings: tuple[tuple[str, str], ...],
    why: str,
    changes_optimisation: bool,
    kept: tuple[tuple[str, str], ...] = (),
    kept_why: tuple[str, ...] = (),
) -> str:
    """The file: what was measured, how to undo, the earlier winners' settings kept (each earlier
    winner's line as a comment), then this winner's."""
    body = [f"# {why}", UNDO, *(f"{EARLIER}{w}" for w in kept_why)]
    body += [f"{k}={v}" for k, v in (*kept, *settings)]
    if changes_optimisation:
        body.append(f"{JOB_SETTING}=1")
    return "\n".join(body) + "\n"


def _whys(text: str) -> tuple[str, ...]:
    """The winners' lines of a file: its own first comment, then those it kept."""
    comments = [ln[2:] for ln in text.splitlines() if ln.startswith("# ") and ln != UNDO]
    return tuple(c.removeprefix(EARLIER[2:]) for c in comments)


def write(
    run_dir: Path,
    settings: tuple[tuple[str, str], ...],
    why: str,
    changes_optimisation: bool,
    say: Callable[[str], None] = print,
) -> Path:
    """Write the winner; over an earlier one, keep the earlier settings this one does not set and `say`
    in one line what it replaces."""
    path = run_dir / FILE
    before = read(run_dir)
    earlier = _whys(path.read_text()) if path.exists() else ()
    new = dict(settings)
    kept = tuple((k, v) for k, v in before.items() if k not in new and k != JOB_SETTING)
    resume = changes_optimisation or (bool(kept) and before.get(JOB_SETTING) == "1")
    path.write_text(lines(settings, why, resume, kept, earlier if kept else ()))
    if before:
        said = [f"{k} {before[k]} -> {v}" for k, v in settings if k in before and before[k] != v]
        if kept:
            said.append(
                "keeps "
                + " ".join(f"{k}={v}" for k, v in kept)
                + " (the job this tune measured ran with them)"
            )
        if before.get(JOB_SETTING) == "1" and not resume:
            said.append(f"drops {JOB_SETTING}=1")
        replaced = earlier[0] if earlier else "an earlier tune"
        say(
            f"tune: {path} replaces the winner of {replaced} ("
            + ("; ".join(said) or "the same settings")
            + ")"
        )
    return path


def read(run_dir: Path) -> dict[str, str]:
    path = run_dir / FILE
    if not path.exists():
        return {}
    pairs = (ln.partition("=") for ln in path.read_text().splitlines() if ln and not ln.startswith("#"))
    return {k.strip(): v.strip() for k, sep, v in pairs if sep}


def record(
    run_dir: Path,
    run: str,
    rows: list[Row],
    null: Row,
    best: Row | None,
    seconds: float,
    project: str = "",
    split: dict | None = None,
) -> Path:
    """tune.json: every candidate's ratios and the null's, for `make diagnose` to cite while `run` of
    `project` is the run it diagnoses (monitoring/verdicts/measured.py); `split`: the job's own step split
    beside the current settings' trial's, and the turns' seed."""
    path = run_dir / RESULT
    data = {
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "project": project,
        "run": run,
        "seconds": round(seconds, 1),
        "null": asdict(null),
        "candidates": [asdict(r) for r in rows],
        "best": best.name if best else None,
        "split": {k: asdict(v) if is_dataclass(v) else v for k, v in (split or {}).items()},
    }
    path.write_text(json.dumps(data, indent=2, default=float))
    return path
