"""What `make tune` measured on this job (RUN_DIR/tune.json, written by monitoring/tune/winner.py), cited
in `make diagnose`'s advice: a setting the advice names gets its ratio on this job next to it, and where
nothing is measured yet the advice says that `make tune` measures it. A tune of another run of the
project (a job since restarted, with the winner or other settings) is quoted as that run's, with its
date; a file of another project (a RUN_DIR shared between projects) is not quoted. `make compare`'s last
verdict (RUN_DIR/compare.json, monitoring/compare.py) is quoted while its run, of this project, is the
one diagnosed. Pure apart from reading the files."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from monitoring.verdicts import verdict

TUNE_HINT = "`make tune` measures these on your job (docs/tune.md)."


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _other_project(result: dict, project: str) -> bool:
    """The file names a project, and not this one (files written before they named one are judged by
    their run alone)."""
    return bool(project and result.get("project") and result["project"] != project)


def _figure(row: dict, at: str) -> str:
    ratios = row.get("ratios") or []
    if not ratios:
        return ""
    ratios = sorted(ratios)
    median = (
        ratios[len(ratios) // 2]
        if len(ratios) % 2
        else sum(ratios[len(ratios) // 2 - 1 : len(ratios) // 2 + 1]) / 2
    )
    return f"{median:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) steps/s {at}"


def cite(advice: tuple[str, ...], result: dict | None, run: str = "", project: str = "") -> tuple[str, ...]:
    """The advice with each setting `make tune` tried quoted with its figure ("on this job" when it tuned
    `run`, else "on run X (not the run diagnosed)" with its date); else the hint, once."""
    if not advice:
        return advice
    if not result or _other_project(result, project):
        return (*advice, TUNE_HINT)
    stamp = result.get("at", "")
    tuned = result.get("run", "")
    if tuned and tuned == run:
        at = f"on this job, `make tune` {stamp[11:16]}"
        null_at = f"`make tune` {stamp[11:16]}"
    else:
        at = f"on run {tuned or '(unknown)'} (not the run diagnosed), `make tune` {stamp[:16].replace('T', ' ')}"
        null_at = f"`make tune` {stamp[:16].replace('T', ' ')} of run {tuned or '(unknown)'}"
    null = result.get("null", {}).get("ratios") or []
    out = []
    for line in advice:
        quoted = [
            f"{r['name']}: {fig}"
            for r in result.get("candidates", [])
            if r["name"] in line and (fig := _figure(r, at))
        ]
        out.append(line + (" Measured: " + "; ".join(quoted) + "." if quoted else ""))
    if null:
        out.append(
            f"{null_at}: the null (current against current) spread {min(null):.2f}-{max(null):.2f}; best: {result.get('best') or 'no better setting found'}."
        )
    return tuple(out)


def compared(advice: tuple[str, ...], result: dict | None, run: str, project: str = "") -> tuple[str, ...]:
    """The advice with `make compare`'s verdict on this run of this project (against the run it names)
    after it; another run's or project's verdict is not quoted (it judged other runs)."""
    if not advice or not result or not run or result.get("run") != run or _other_project(result, project):
        return advice
    return (*advice, f"`make compare` {result.get('at', '')[11:16]}: {result.get('text', '')}")


def with_measured(
    d: verdict.Diagnosis, tune: dict | None, compare: dict | None = None, run: str = "", project: str = ""
) -> verdict.Diagnosis:
    advice = compared(cite(d.cluster.advice, tune, run, project), compare, run, project)
    return replace(d, cluster=replace(d.cluster, advice=advice))
