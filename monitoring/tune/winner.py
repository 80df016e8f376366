"""The winner file: where `make tune` writes the best setting it measured and `make up` reads it
(compose/up.sh: a setting given on make's command line wins over the file; `make up` says it used it
and how to undo it). One `NAME=value` line per setting under a comment saying what was measured; the
measured figures also go to tune.json beside it, which `make diagnose` cites."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path

from monitoring.tune.table import Row

FILE = "tuned.env"
RESULT = "tune.json"
JOB_SETTING = "RESUME_NEW_SETTINGS"
"""Set with a winner that changes a job setting: the checkpoint's own would refuse it."""


def lines(settings: tuple[tuple[str, str], ...], why: str, changes_optimisation: bool) -> str:
    body = [
        f"# {why}",
        "# make up reads this file; undo: delete it (or give the setting on make's command line)",
    ]
    body += [f"{k}={v}" for k, v in settings]
    if changes_optimisation:
        body.append(f"{JOB_SETTING}=1")
    return "\n".join(body) + "\n"


def write(run_dir: Path, settings: tuple[tuple[str, str], ...], why: str, changes_optimisation: bool) -> Path:
    path = run_dir / FILE
    path.write_text(lines(settings, why, changes_optimisation))
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
    split: dict | None = None,
) -> Path:
    """tune.json: every candidate's ratios and the null's, for `make diagnose` to cite; `split`: the job's
    own step split beside the current settings' trial's, and the turns' seed."""
    path = run_dir / RESULT
    data = {
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "run": run,
        "seconds": round(seconds, 1),
        "null": asdict(null),
        "candidates": [asdict(r) for r in rows],
        "best": best.name if best else None,
        "split": {k: asdict(v) if is_dataclass(v) else v for k, v in (split or {}).items()},
    }
    path.write_text(json.dumps(data, indent=2, default=float))
    return path
