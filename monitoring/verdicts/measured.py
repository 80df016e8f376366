"""What `make tune` measured on this job (RUN_DIR/tune.json, written by monitoring/tune/winner.py), cited
in `make diagnose`'s advice: a setting the advice names gets its ratio on this job next to it, and where
nothing is measured yet the advice says that `make tune` measures it. `make compare`'s last verdict
(RUN_DIR/compare.json, monitoring/compare.py) is quoted while its run is the one diagnosed. Pure apart
from reading the files."""

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
    return f"{median:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) steps/s on this job, `make tune` {at}"


def cite(advice: tuple[str, ...], result: dict | None) -> tuple[str, ...]:
    """The advice with each setting `make tune` tried quoted with its figure; else the hint, once."""
    if not advice:
        return advice
    if not result:
        return (*advice, TUNE_HINT)
    at = result.get("at", "")[11:16]
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
            f"`make tune` {at}: the null (current against current) spread {min(null):.2f}-{max(null):.2f}; best: {result.get('best') or 'no better setting found'}."
        )
    return tuple(out)


def compared(advice: tuple[str, ...], result: dict | None, run: str) -> tuple[str, ...]:
    """The advice with `make compare`'s verdict on this run (against the run it names) after it."""
    if not advice or not result or result.get("run") != run:
        return advice
    return (*advice, f"`make compare` {result.get('at', '')[11:16]}: {result.get('text', '')}")


def with_measured(
    d: verdict.Diagnosis, tune: dict | None, compare: dict | None = None, run: str = ""
) -> verdict.Diagnosis:
    advice = compared(cite(d.cluster.advice, tune), compare, run)
    return replace(d, cluster=replace(d.cluster, advice=advice))
