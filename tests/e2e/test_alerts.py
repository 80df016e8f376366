"""Alerts reach someone: a real stack (its own project), a stalled job, and a real webhook receiver.

A chief + 1 worker train; worker-0's TensorFlow traffic is then dropped in its network namespace
(iptables, everything but the metrics port), so the collective hangs while every task stays scraped:
a stalled job, not a dead one (a long heartbeat timeout keeps TensorFlow from aborting it). The
`TrainingStalled` alert must reach the receiver (an HTTP server of this test on the stack's monitoring
network gateway, which the Alertmanager container reaches; the shipped routing, only the receiver
changed): Prometheus must fire it within its `for:` plus one evaluation interval of its becoming
pending, and Alertmanager deliver it within its `group_wait` plus one evaluation interval. When the
traffic flows again the resolution must arrive too. On the same stack: Prometheus' lifecycle API is
off, retention is by time and size, and container logs are rotated (docs/security.md).

Its own project (ALERTS_PROJECT and ALERTS_BIND_ADDR, defaults in tests/e2e/places.py), so other stacks are never
touched. IMAGE_REPO is honoured (a checkout's own trainer image).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from compose import services
from tests.e2e import places
from tests.e2e.alerting import EVALUATION, GROUP_WAIT, Inbox, rfc3339, rule_for, wait, with_receiver
from tests.e2e.conftest import ROOT, engine_ready
from tests.e2e.faultstack import FaultStack

pytestmark = pytest.mark.docker

PROJECT = os.environ.get("ALERTS_PROJECT", places.ALERTS.project)
STACK = FaultStack(
    PROJECT,
    f".run/{PROJECT}",
    os.environ.get("ALERTS_BIND_ADDR", places.ALERTS.bind),
    {
        "WORKERS": "1",
        "STEPS": "100000000",
        "INPUT_DELAY_MS": "25",  # at most 40 steps/s: not flat out through the alert's timers
        "SAVE_EVERY": "0",
        "HEARTBEAT_TIMEOUT": "3600",
        "IMAGE_REPO": os.environ.get("IMAGE_REPO", "mwms/trainer"),
    },
)


def stall_for() -> float:
    return rule_for("TrainingStalled")


def gateway() -> str:
    """The host's address on the stack's monitoring network: reachable from the Alertmanager container."""
    return subprocess.run(
        ["docker", "network", "inspect", f"{PROJECT}_monitoring", "-f", "{{(index .IPAM.Config 0).Gateway}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def receiver_config(tmp: Path, url: str) -> Path:
    """The shipped config with the receiver pointed at this test: routing and timings unchanged."""
    folder = tmp / "alertmanager"
    folder.mkdir()
    (folder / "alertmanager.yml").write_text(with_receiver(url))
    folder.chmod(0o755)
    (folder / "alertmanager.yml").chmod(0o644)
    override = tmp / "override.yaml"
    mount = {"type": "bind", "source": str(folder), "target": "/etc/alertmanager", "read_only": True}
    override.write_text(yaml.safe_dump({"services": {"alertmanager": {"volumes": [mount]}}}))
    return override


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[FaultStack, Inbox]]:
    engine_ready()
    up = STACK.make("up", timeout=1200)
    assert up.returncode == 0, up.stdout + up.stderr
    inbox = Inbox(gateway())
    override = receiver_config(tmp_path_factory.mktemp("alerts"), inbox.url)
    files = (ROOT / STACK.run_dir / "compose.args").read_text().split()
    recreate = subprocess.run(
        [
            "docker",
            "compose",
            "--project-directory",
            str(ROOT),
            "--env-file",
            str(ROOT / STACK.run_dir / "stack.env"),
            *files,
            "-f",
            str(override),
            "up",
            "-d",
            "--no-deps",
            "--wait",
            "alertmanager",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert recreate.returncode == 0, recreate.stderr
    try:
        yield STACK, inbox
    finally:
        inbox.close()
        STACK.make("clean", timeout=300)


def api(url: str, method: str = "GET") -> tuple[int, str]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def prometheus_alert(name: str, **labels: str) -> dict | None:
    _, body = api(f"{STACK.prometheus}/api/v1/alerts")
    wanted = {"alertname": name, **labels}
    return next(
        (a for a in json.loads(body)["data"]["alerts"] if wanted.items() <= a["labels"].items()), None
    )


def block_tensorflow(service: str, on: bool) -> None:
    """Drop every TCP packet of the task but its metrics port's: the collective hangs, scrapes go on."""
    pid = STACK.inspect(service, "{{.State.Pid}}")
    op = "-I" if on else "-D"
    for chain, port in (("INPUT", "--dport"), ("OUTPUT", "--sport")):
        subprocess.run(
            ["nsenter", "-t", pid, "-n", "iptables", op, chain, "-p", "tcp", "!", port, "8000", "-j", "DROP"],
            check=True,
            capture_output=True,
        )


def test_a_stalled_job_is_delivered_and_resolved(stack):
    stack, inbox = stack
    stack.wait_for_step(50, timeout=600)
    start = time.time()
    block_tensorflow("worker-0", on=True)
    try:
        assert wait(lambda: prometheus_alert("TrainingStalled"), timeout=400), "never pending"
        fired = wait(
            lambda: inbox.notification("TrainingStalled", "firing", start), timeout=stall_for() + 120
        )
        assert fired, f"no TrainingStalled notification; received: {inbox.received}"
        arrived, body = fired
        alert = body["alerts"][0]
        task = {k: alert["labels"][k] for k in ("task_type", "task_index", "run")}
        pending = prometheus_alert("TrainingStalled", **task)
    finally:
        block_tensorflow("worker-0", on=False)
    active, fired_at = rfc3339(pending["activeAt"]), rfc3339(alert["startsAt"])
    print(
        f"TrainingStalled: pending {active - start:.1f} s after the block, fired {fired_at - active:.1f} s "
        f"later (for: {stall_for():g} s, evaluation {EVALUATION:g} s), delivered {arrived - fired_at:.1f} s "
        f"after firing (group_wait {GROUP_WAIT:g} s); load {os.getloadavg()[0]:.1f}"
    )
    assert fired_at - active <= stall_for() + EVALUATION
    assert arrived - fired_at <= GROUP_WAIT + EVALUATION
    assert alert["labels"]["project"] == PROJECT and alert["labels"]["run"], alert["labels"]
    assert "has made no step" in alert["annotations"]["summary"]
    assert not inbox.notification("TrainerDown", "firing", start), "every task stayed scraped"
    resolved = wait(lambda: inbox.notification("TrainingStalled", "resolved", arrived), timeout=600)
    assert resolved, f"no resolution after the traffic flowed again; received: {inbox.received}"
    print(f"TrainingStalled resolved: delivered {resolved[0] - arrived:.1f} s after the firing notification")


def test_prometheus_lifecycle_api_is_off(stack):
    stack, _ = stack
    code, body = api(f"{stack.prometheus}/-/quit", method="POST")
    assert code == 403 and "Lifecycle API is not enabled" in body, (code, body)


def test_prometheus_retains_by_time_and_size(stack):
    stack, _ = stack
    _, body = api(f"{stack.prometheus}/api/v1/status/flags")
    flags = json.loads(body)["data"]
    assert flags["storage.tsdb.retention.time"] == services.RETENTION_TIME
    assert flags["storage.tsdb.retention.size"] == services.RETENTION_SIZE.replace("GB", "GiB")


def test_container_logs_are_rotated(stack):
    stack, _ = stack
    for service in ("chief", "worker-0", "prometheus", "alertmanager"):
        config = json.loads(stack.inspect(service, "{{json .HostConfig.LogConfig}}"))
        assert config["Type"] == "json-file", service
        assert config["Config"] == services.LOGGING["options"], service
