"""Grafana dashboards as code (grafana-foundation-sdk). `python -m monitoring.dashboards` writes
them to monitoring/config/grafana/dashboards as the plain JSON that file provisioning loads."""

import json
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from . import overview, task

OUT_DIR = Path(__file__).resolve().parent.parent / "config" / "grafana" / "dashboards"


def build_all() -> dict[str, dict]:
    """File name → dashboard JSON model."""
    built = {"training-overview.json": overview.build(), "task-detail.json": task.build()}
    return {name: json.loads(json.dumps(d.build(), cls=JSONEncoder)) for name, d in built.items()}


def render(dashboard: dict) -> str:
    """Stable text: sorted keys, so regenerating gives byte-identical files."""
    return json.dumps(dashboard, indent=2, sort_keys=True) + "\n"
