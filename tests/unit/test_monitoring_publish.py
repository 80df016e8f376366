"""Publishing to an existing Grafana. No Grafana server can be installed on our machines (none is on
a registry we reach), so the upload itself is tested against a real Grafana only when GRAFANA_URL
(and GRAFANA_TOKEN) are set; we do not fake one. The request building is tested always."""

import os

import pytest

from monitoring.dashboards.publish import payload, publish, retarget
from monitoring.prom.promql import load_dashboards


def uids(node) -> set[str]:
    """Every datasource uid referenced anywhere in a dashboard."""
    found, stack = set(), [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("datasource"), dict):
                found.add(item["datasource"].get("uid"))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return found


def test_retarget_points_every_query_at_another_datasource_without_touching_the_original():
    dashboard = load_dashboards()["training-overview.json"]
    moved = retarget(dashboard, "their-prom")
    assert uids(dashboard) == {"prometheus"}
    assert uids(moved) == {"their-prom"}


def test_payload_overwrites_by_uid_into_the_folder():
    dashboard = load_dashboards()["task-detail.json"]
    body = payload(dashboard, folder_uid="training", message="m")
    assert body == {"dashboard": dashboard, "folderUid": "training", "overwrite": True, "message": "m"}
    assert "id" not in body["dashboard"]  # Grafana matches on uid; an id would pin one instance


@pytest.mark.skipif(
    not os.environ.get("GRAFANA_URL"), reason="needs a real Grafana: set GRAFANA_URL and GRAFANA_TOKEN"
)
def test_publish_to_a_real_grafana():
    from grafana_client import GrafanaApi

    api = GrafanaApi.from_url(os.environ["GRAFANA_URL"], credential=os.environ.get("GRAFANA_TOKEN") or None)
    datasource_uid = os.environ.get("GRAFANA_DATASOURCE_UID", "prometheus")
    for _ in range(2):  # the second run overwrites by uid instead of failing
        publish(api, folder_uid="training", folder_title="Training", datasource_uid=datasource_uid)
    for dashboard in load_dashboards().values():
        stored = api.dashboard.get_dashboard(dashboard["uid"])
        assert stored["meta"]["folderUid"] == "training"
        assert stored["dashboard"]["title"] == dashboard["title"]
