"""`make report` draws a PNG of the run from the live stack's Prometheus."""

from pathlib import Path

import pytest

from monitoring.prom.client import Prometheus
from monitoring.prom.promql import wait_for_data
from monitoring.rules import recording as rules

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]


def test_make_report_writes_a_png(stack):
    # The report plots the recording rules: wait until every task has them.
    wait_for_data(Prometheus(url=stack.prometheus_url), rules.OTHER, tasks=stack.workers + 1, timeout=240)
    out = Path(stack.run_dir) / "report.png"  # kept with the run: a CI artifact
    out.unlink(missing_ok=True)
    # stack.make names the stack's PROJECT and RUN_DIR, as a user of another project types them.
    result = stack.make("report", f"PROMETHEUS_URL={stack.prometheus_url}", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000, "stacked breakdowns per task, throughput and loss make a larger picture"
