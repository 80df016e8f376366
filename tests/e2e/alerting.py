"""What the alert delivery tests share (Compose: test_alerts.py, Swarm: test_swarm.py): the shipped
timings, read from the files a user edits, and a real webhook receiver that records every notification."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

from tests.e2e.conftest import ROOT

CONFIG = ROOT / "monitoring" / "config" / "alertmanager" / "alertmanager.yml"
PROMETHEUS_CONFIG = ROOT / "monitoring" / "config" / "prometheus" / "prometheus.yml"
RULES = ROOT / "monitoring" / "config" / "prometheus" / "rules" / "trainer.alerts.yml"


def seconds(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(text[:-1]) * units[text[-1]]


def rule_for(alert: str) -> float:
    """The shipped `for:` of an alert, in seconds."""
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    return seconds(next(r["for"] for r in rules if r.get("alert") == alert))


EVALUATION = seconds(yaml.safe_load(PROMETHEUS_CONFIG.read_text())["global"]["evaluation_interval"])
SCRAPE = seconds(yaml.safe_load(PROMETHEUS_CONFIG.read_text())["global"]["scrape_interval"])
GROUP_WAIT = seconds(yaml.safe_load(CONFIG.read_text())["route"]["group_wait"])
GROUP_INTERVAL = seconds(yaml.safe_load(CONFIG.read_text())["route"]["group_interval"])


def with_receiver(url: str) -> str:
    """The shipped config with its `training` receiver pointed at `url`: routing and timings unchanged,
    the edit a user makes."""
    doc = yaml.safe_load(CONFIG.read_text())
    (training,) = [r for r in doc["receivers"] if r["name"] == "training"]
    training["webhook_configs"] = [{"url": url, "send_resolved": True}]
    return yaml.safe_dump(doc, sort_keys=False)


class Inbox:
    """Alertmanager's webhook on `host` (an address the Alertmanager container reaches): every
    notification, with the time it arrived."""

    def __init__(self, host: str) -> None:
        self.received: list[tuple[float, dict]] = []
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                inbox.received.append((time.time(), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def notification(self, name: str, status: str, since: float, **labels: str) -> tuple[float, dict] | None:
        """The first notification of alert `name` in `status` since `since` whose common labels hold `labels`."""
        wanted = {"alertname": name, **labels}
        for at, body in self.received:
            if at >= since and body["status"] == status and wanted.items() <= body["commonLabels"].items():
                return at, body
        return None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def wait(what, timeout: float, every: float = 1.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if found := what():
            return found
        time.sleep(every)
    return None


def rfc3339(text: str) -> float:
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float(f"0.{frac or 0}")
