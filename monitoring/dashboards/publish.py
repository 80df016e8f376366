"""`make publish-dashboards`: upload the committed dashboards to an existing Grafana with
grafana-client, into one folder, overwriting by uid. Tested against a real Grafana only when
GRAFANA_URL is set (no Grafana server can be installed on our machines; we do not fake one)."""

import argparse
import copy
import logging
import os
import sys
from urllib.parse import urlsplit, urlunsplit

from grafana_client import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException

from monitoring.prom.promql import load_dashboards

log = logging.getLogger(__name__)

OUR_DATASOURCE_UID = "prometheus"


def retarget(node, datasource_uid: str):
    """A copy of a dashboard (or any part) whose Prometheus datasource references use another uid:
    an existing Grafana's Prometheus datasource seldom has our provisioned uid."""
    node = copy.deepcopy(node)
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ds = item.get("datasource")
            if isinstance(ds, dict) and ds.get("uid") == OUR_DATASOURCE_UID:
                ds["uid"] = datasource_uid
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return node


def payload(dashboard: dict, *, folder_uid: str, message: str) -> dict:
    """The POST /api/dashboards/db body: overwrite whatever has the same uid."""
    return {"dashboard": dashboard, "folderUid": folder_uid, "overwrite": True, "message": message}


def ensure_folder(api: GrafanaApi, uid: str, title: str) -> None:
    try:
        api.folder.get_folder(uid)
    except GrafanaClientError as e:
        if e.status_code != 404:
            raise
        api.folder.create_folder(title, uid=uid)
        log.info("created folder %r (uid %s)", title, uid)


def publish(api: GrafanaApi, *, folder_uid: str, folder_title: str, datasource_uid: str) -> list[str]:
    """Upload every committed dashboard; returns the URLs Grafana reports."""
    ensure_folder(api, folder_uid, folder_title)
    urls = []
    for name, dashboard in load_dashboards().items():
        body = payload(
            retarget(dashboard, datasource_uid),
            folder_uid=folder_uid,
            message=f"make publish-dashboards ({name})",
        )
        result = api.dashboard.update_dashboard(body)
        urls.append(result.get("url", dashboard["uid"]))
        log.info("published %s → %s", name, result.get("url"))
    return urls


def redact(url: str) -> str:
    """The URL without a user:password, for log lines."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitoring.dashboards.publish", description=__doc__)
    parser.add_argument(
        "--url",
        default=os.environ.get("GRAFANA_URL"),
        help="Grafana base URL (default $GRAFANA_URL); user:password@ in it for basic auth",
    )
    parser.add_argument("--folder-uid", default="training")
    parser.add_argument("--folder-title", default="Training")
    parser.add_argument(
        "--datasource-uid",
        default=OUR_DATASOURCE_UID,
        help="uid of the Prometheus datasource in that Grafana that scrapes the trainer",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not args.url:
        log.error("publish: set GRAFANA_URL (and GRAFANA_TOKEN, a service account token)")
        return 2
    # The token comes from the environment only, so it never shows in `ps` or shell history.
    api = GrafanaApi.from_url(args.url, credential=os.environ.get("GRAFANA_TOKEN") or None)
    try:
        publish(
            api,
            folder_uid=args.folder_uid,
            folder_title=args.folder_title,
            datasource_uid=args.datasource_uid,
        )
    except GrafanaException as e:
        log.error("publish: %s answered %s: %s", redact(args.url), e.status_code, e.message)
        return 1
    except OSError as e:  # connection refused, DNS, TLS (niquests' errors are OSErrors)
        log.error("publish: cannot reach %s: %s", redact(args.url), e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
