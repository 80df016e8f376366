"""Dashboards as code: the committed JSON is exactly what the generator writes, and every panel
follows the rules that make provisioning and reading them work."""

import json
import re
from pathlib import Path

import pytest
import yaml

import contract
from monitoring import dashboards
from monitoring.prom.promql import DASHBOARD_DIR, load_dashboards, panel_queries, substitute

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted((ROOT / "monitoring" / "config" / "prometheus" / "rules").glob("*.yml"))

# The dashboards may use the contract's series and nothing else.
CONTRACT = {contract.exposed_name(m) for m in contract.ALL}
HISTOGRAM_SERIES = {
    s for m in contract.ALL if m.kind == contract.HISTOGRAM for s in (m.bucket, m.sum, m.count)
}

COMMITTED = load_dashboards()


def panels(dashboard: dict):
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_generator_output_equals_committed_json():
    generated = {name: dashboards.render(d) for name, d in dashboards.build_all().items()}
    committed = {p.name: p.read_text() for p in DASHBOARD_DIR.glob("*.json")}
    assert generated == committed, "run `make dashboards` and commit the result"


def test_uids_are_fixed():
    assert {d["uid"] for d in COMMITTED.values()} == {"trainer-overview", "trainer-task"}


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_no_import_placeholders(name):
    text = (DASHBOARD_DIR / name).read_text()
    assert "__inputs" not in text and "${DS_" not in text


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_every_panel_has_unit_description_and_datasource_by_uid(name):
    dashboard = COMMITTED[name]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        title = panel["title"]
        assert len(panel.get("description", "")) > 40, title
        assert panel["fieldConfig"]["defaults"].get("unit"), title
        assert panel["datasource"] == {"type": "prometheus", "uid": "prometheus"}, title
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert ref_ids and all(ref_ids) and len(ref_ids) == len(set(ref_ids)), title
        for target in panel["targets"]:
            assert target["datasource"] == {"type": "prometheus", "uid": "prometheus"}, title


def test_variables_query_the_datasource_by_uid():
    for dashboard in COMMITTED.values():
        for variable in dashboard["templating"]["list"]:
            assert variable["datasource"]["uid"] == "prometheus"


def test_queries_use_only_contract_metrics_and_recorded_rules():
    recorded = {
        r["record"]
        for f in RULE_FILES
        for g in yaml.safe_load(f.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    for dashboard in COMMITTED.values():
        for q in panel_queries(dashboard):
            rule_names = re.findall(r"\b(?:task|cluster):[a-z0-9_]+:[a-z0-9_]+", q.expr)
            for name in rule_names:
                assert name in recorded, (q.panel, name)
            raw = re.sub(r"\b(?:task|cluster):[a-z0-9_]+:[a-z0-9_]+", "", q.expr)
            for name in re.findall(r"\btrainer_[a-z_]+\b", raw):
                assert name in CONTRACT | HISTOGRAM_SERIES, (q.panel, name)


def test_overview_has_the_panels_users_asked_for():
    titles = {p["title"] for p in panels(COMMITTED["training-overview.json"])}
    assert {
        "Throughput",
        "Steps per second",
        "Loss",
        "Step time p50 / p95 per task",
        "Step breakdown: $task",
        "Straggler ratio",
        "All-reduce bus bandwidth",
        "Network traffic per task",
        "Build info per task",
        "Firing alerts",
        "Verdict",
        "Verdict per task",
    } <= titles


def test_verdict_panel_names_every_code_of_make_diagnose():
    from monitoring.verdicts import verdict

    stat = next(
        p
        for p in panels(COMMITTED["training-overview.json"])
        if p["title"] == "Verdict" and p["type"] == "stat"
    )
    shown = stat["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {int(code): m["text"] for code, m in shown.items()} == {
        code: name for code, name in verdict.NAMES.items() if code >= 0
    }


def test_task_detail_has_a_task_variable():
    project, run, variable = COMMITTED["task-detail.json"]["templating"]["list"]
    assert (project["name"], run["name"]) == ("project", "run")
    assert variable["name"] == "task" and not variable["multi"]
    for q in panel_queries(COMMITTED["task-detail.json"]):
        assert 'instance="$task"' in q.expr, q.panel


def test_substitute_replaces_grafana_intervals_and_variables():
    expr = 'rate(x{instance="$task", t="${task_type}"}[$__rate_interval]) offset $__interval'
    variables = {"task": "w:1", "task_type": "worker"}
    got = substitute(expr, rate_interval="20s", interval="5s", variables=variables)
    assert got == 'rate(x{instance="w:1", t="worker"}[20s]) offset 5s'


def test_provisioning_matches_the_dashboards_and_scrape_interval():
    prov = ROOT / "monitoring" / "config" / "grafana" / "provisioning"
    (ds,) = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())["datasources"]
    scrape = yaml.safe_load((ROOT / "monitoring" / "config" / "prometheus" / "prometheus.yml").read_text())
    assert ds["uid"] == "prometheus" and ds["url"] == f"http://prometheus:{contract.PROMETHEUS_PORT}"
    assert ds["jsonData"]["timeInterval"] == scrape["global"]["scrape_interval"]
    (provider,) = yaml.safe_load((prov / "dashboards" / "trainer.yml").read_text())["providers"]
    assert provider["type"] == "file" and provider["folder"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    # File provisioning wants the plain dashboard model, not an export wrapper.
    for dashboard in COMMITTED.values():
        assert "dashboard" not in dashboard and "id" not in dashboard
        json.dumps(dashboard)


SERIES = re.compile(r"\b((?:task|cluster):[a-z0-9_]+:[a-z0-9_]+|trainer_[a-z_]+|ALERTS|up)\b(\{[^}]*\})?")


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_every_series_a_panel_reads_is_of_the_selected_run(name):
    """Runs never mix: every selector of every query names the Project and Run variables (an earlier
    run of the same stack has the same task names and stays in Prometheus)."""
    scope = {f'{contract.PROJECT_LABEL}="$project"', f'{contract.RUN_LABEL}="$run"'}
    for q in panel_queries(COMMITTED[name]):
        found = SERIES.findall(q.expr)
        assert found, (q.panel, q.expr)
        for series, selector in found:
            assert scope <= {m.strip() for m in selector.strip("{}").split(",")}, (q.panel, series)
    runs = next(v for v in COMMITTED[name]["templating"]["list"] if v["name"] == "run")
    assert runs["sort"] == 2, "newest run first: the default is the latest run"
