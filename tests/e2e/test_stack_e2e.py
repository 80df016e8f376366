"""`make up WORKERS=2` on the real engine, offline images: every task trains, Prometheus sees it all."""

from __future__ import annotations

import json
import subprocess

import pytest

pytestmark = pytest.mark.docker


def test_every_task_is_a_target_with_one_task_type_and_index(stack) -> None:
    targets = json.loads((stack.run_dir / "targets" / "trainers.json").read_text())
    assert [(t["labels"]["task_type"], t["labels"]["task_index"]) for t in targets] == stack.tasks
    # honor_labels: no exported_task_type / exported_task_index duplicates on any trainer series.
    for expr in ('count({job="trainer", exported_task_type!=""})', 'count({job="trainer", exported_task_index!=""})'):
        assert stack.query(expr) == {}, expr


def test_first_step_seen_quickly(stack) -> None:
    print(f"make up: {stack.up_seconds:.1f} s; first step in Prometheus after {stack.first_step_seconds:.1f} s")
    assert stack.first_step_seconds < 300


def test_training_completes_and_wait_returns_zero(stack) -> None:
    result = stack.make("wait", timeout=600)
    assert result.returncode == 0, result.stderr
    steps = stack.query("max by (task_type, task_index) (max_over_time(trainer_steps_total[30m]))")
    assert set(steps) == set(stack.tasks), steps
    assert all(v >= stack.steps for v in steps.values()), f"steps seen in Prometheus: {steps}"


def test_only_the_ui_ports_are_published(stack) -> None:
    ids = subprocess.run(["docker", "ps", "-aq", "--filter", "label=com.docker.compose.project=mwms"],
                         capture_output=True, text=True, check=True).stdout.split()
    out = subprocess.run(["docker", "inspect", "-f", '{{index .Config.Labels "com.docker.compose.service"}} '
                          "{{json .HostConfig.PortBindings}}", *ids], capture_output=True, text=True, check=True)
    published = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in out.stdout.splitlines()}
    for service, bindings in published.items():
        if service == "prometheus":
            assert bindings == {"9090/tcp": [{"HostIp": "127.0.0.1", "HostPort": "9090"}]}
        elif service != "grafana":
            assert not bindings, f"{service} publishes {bindings}"

