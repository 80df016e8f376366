"""The Alertmanager config users edit, and the receivers docs/alerts.md tells them to paste: valid for
amtool (Alertmanager 0.25, strict about unknown keys), grouped by labels every training alert
carries, and routing every alert to a receiver."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

import contract
from monitoring.rules import alerts

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "monitoring" / "config" / "alertmanager" / "alertmanager.yml"
DOC = ROOT / "docs" / "alerts.md"

# `amtool`: the fixture in tests/conftest.py (fails in CI, skips elsewhere when it is missing).


def run(binary: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)


def check(binary: str, path: Path) -> None:
    result = run(binary, "check-config", str(path))
    assert result.returncode == 0, f"amtool check-config {path}:\n{result.stdout}\n{result.stderr}"


def test_the_config_is_valid(amtool):
    check(amtool, CONFIG)


def test_a_broken_config_is_refused(amtool, tmp_path):
    """The check can fail: an unknown key (a typo) is an error in 0.25, not ignored."""
    doc = yaml.safe_load(CONFIG.read_text())
    doc["route"]["group_wiat"] = "5s"
    (tmp_path / "bad.yml").write_text(yaml.safe_dump(doc))
    assert run(amtool, "check-config", str(tmp_path / "bad.yml")).returncode != 0


def alert_labels() -> set[str]:
    """Labels every training alert has: its name, severity, and the series' own (the rules keep them)."""
    return {"alertname", "severity", *contract.TASK_BY}


def test_grouping_uses_only_labels_every_alert_carries():
    route = yaml.safe_load(CONFIG.read_text())["route"]
    assert set(route["group_by"]) <= alert_labels()
    assert {contract.PROJECT_LABEL, contract.RUN_LABEL} <= set(route["group_by"]), "runs never mix"


@pytest.mark.parametrize("alert", alerts.ALERTS, ids=lambda a: a.name)
def test_every_alert_reaches_a_receiver(amtool, alert):
    result = run(
        amtool,
        "config",
        "routes",
        "test",
        f"--config.file={CONFIG}",
        f"alertname={alert.name}",
        f"severity={alert.severity}",
    )
    assert result.returncode == 0 and result.stdout.strip() == "training", result.stdout + result.stderr


def doc_blocks(kind: str) -> list[str]:
    return re.findall(rf"```yaml {kind}\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.parametrize("n", range(3))
def test_each_receiver_the_docs_show_is_valid_in_the_config(amtool, tmp_path, n):
    """docs/alerts.md's Slack, e-mail and webhook receivers, pasted as the docs say, pass amtool."""
    blocks = doc_blocks("receiver")
    assert len(blocks) == 3
    doc = yaml.safe_load(CONFIG.read_text())
    doc["receivers"] = yaml.safe_load(blocks[n])
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    check(amtool, tmp_path / "alertmanager.yml")


def test_the_docs_routes_to_two_receivers_are_valid(amtool, tmp_path):
    (routes,) = doc_blocks("routes")
    doc = yaml.safe_load(CONFIG.read_text())
    doc["route"]["routes"] = yaml.safe_load(routes)
    doc["receivers"] = [{"name": "training"}, {"name": "training-pager"}, {"name": "training-chat"}]
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    check(amtool, tmp_path / "alertmanager.yml")
