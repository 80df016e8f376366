"""Prometheus config, the generated rules, alerts and promtool tests: they equal what `make rules`
writes, pass promtool's checks and unit tests, and keep the conventions promtool cannot see (rule
names, alert annotations, a firing and a non-firing case per alert)."""

import re
import subprocess
from pathlib import Path

import yaml

import contract
from monitoring.rules import alerts as alert_defs
from monitoring.rules import rulegen as generator

PROM_DIR = Path(__file__).resolve().parents[2] / "monitoring" / "config" / "prometheus"
RULE_FILES = sorted((PROM_DIR / "rules").glob("*.yml"))
TEST_FILES = sorted((PROM_DIR / "tests").glob("*.yml"))
ALERTS = {
    "TrainerDown",
    "TrainingStalled",
    "TaskStuck",
    "Straggler",
    "InputBound",
    "CommunicationBound",
    "LossNotFinite",
}


def test_committed_files_are_what_the_generator_writes():
    assert generator.main(["--check"]) == 0, "run `make rules`"
    assert set(generator.files()) == set(RULE_FILES) | set(TEST_FILES), "a rule or test file nobody generates"


def test_every_alert_is_generated():
    assert {a.name for a in alert_defs.ALERTS} == ALERTS


# `promtool`: the fixture in tests/conftest.py (fails in CI, skips elsewhere when it is missing).


def run(promtool: str, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def test_config_is_valid(promtool):
    run(promtool, "check", "config", str(PROM_DIR / "prometheus.yml"))


def test_rules_are_valid(promtool):
    run(promtool, "check", "rules", *map(str, RULE_FILES))


def test_rule_unit_tests_pass(promtool):
    run(promtool, "test", "rules", *map(str, TEST_FILES))


def rules() -> list[dict]:
    return [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]


def test_recording_rules_are_named_level_metric_operation():
    names = [r["record"] for r in rules() if "record" in r]
    assert names and len(names) == len(set(names))
    for name in names:
        assert re.fullmatch(r"(task|cluster):trainer_[a-z0-9_]+:[a-z0-9_]+", name), name


def test_every_alert_has_for_severity_and_names_the_task():
    alerts = {r["alert"]: r for r in rules() if "alert" in r}
    assert ALERTS <= set(alerts)
    for name, rule in alerts.items():
        assert rule.get("for"), name
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        for key in ("summary", "description"):
            text = rule["annotations"][key]
            assert alert_defs.TASK in text, (name, key)  # the task as contract.task_name names it


def test_every_alert_has_a_firing_and_a_non_firing_case():
    cases: dict[str, set[bool]] = {}
    for path in TEST_FILES:
        for group in yaml.safe_load(path.read_text())["tests"]:
            for case in group.get("alert_rule_test", []):
                cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert {name: cases.get(name) for name in alerts} == {name: {True, False} for name in alerts}


def test_scrape_config_matches_the_deployment_contract():
    config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    assert config["global"]["scrape_interval"] == "5s"
    (trainer,) = [job for job in config["scrape_configs"] if job["job_name"] == contract.JOB]
    (own,) = [job for job in config["scrape_configs"] if job["job_name"] == "prometheus"]
    assert own["static_configs"][0]["targets"] == [f"localhost:{contract.PROMETHEUS_PORT}"]
    assert trainer["honor_labels"] is True
    # Relative to the config file: /etc/prometheus/targets in the container.
    assert trainer["file_sd_configs"][0]["files"] == ["targets/*.json"]
    assert config["rule_files"] == ["rules/*.yml"]
    # The targets directory is a mount point inside the read-only /etc/prometheus mount.
    assert (PROM_DIR / "targets").is_dir()
