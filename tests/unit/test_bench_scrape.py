"""bench/scrape.py: the Prometheus of `make bench` (f) scrapes the tasks as the stack's does (its
interval, timeout and trainer job, read from the stack's own prometheus.yml), and counts its scrapes."""

from __future__ import annotations

import time

import yaml
from prometheus_client import CollectorRegistry, Counter, start_http_server

import contract
from bench import scrape
from tests.conftest import need


def test_the_config_is_the_stacks_global_section_and_trainer_job_on_a_file_of_ours(tmp_path):
    stack = yaml.safe_load(scrape.STACK_CONFIG.read_text())
    got = scrape.config(tmp_path / "targets.json", stack)
    assert got["global"] == stack["global"]  # scrape_interval and scrape_timeout: the stack's
    (job,) = got["scrape_configs"]
    (theirs,) = [j for j in stack["scrape_configs"] if j["job_name"] == contract.JOB]
    assert {k: v for k, v in job.items() if k != "file_sd_configs"} == {
        k: v for k, v in theirs.items() if k != "file_sd_configs"
    }
    assert [s["files"] for s in job["file_sd_configs"]] == [[str(tmp_path / "targets.json")]]
    assert [s["refresh_interval"] for s in job["file_sd_configs"]] == [
        s["refresh_interval"] for s in theirs["file_sd_configs"]
    ]


def test_without_the_binary_nothing_scrapes_and_the_result_says_so(monkeypatch):
    monkeypatch.setattr(scrape.shutil, "which", lambda name: None)
    none = scrape.start()
    none.targets(["127.0.0.1:1"])
    assert none.scrapes() == 0 and "unscraped" in none.said
    none.close()


def test_a_metrics_server_is_scraped_at_the_stacks_interval():
    need("prometheus")
    registry = CollectorRegistry()
    Counter("bench_scrape_probe", "a probe", registry=registry).inc()
    server, thread = start_http_server(0, "127.0.0.1", registry=registry)
    prometheus = scrape.start()
    try:
        prometheus.targets([f"127.0.0.1:{server.server_port}"])
        deadline = time.monotonic() + 120  # Prometheus' start, a file_sd refresh, one interval
        while prometheus.scrapes() < 1 and time.monotonic() < deadline:
            time.sleep(1)
        assert prometheus.scrapes() >= 1, (prometheus.work / "prometheus.log").read_text()[-2000:]
        assert prometheus.interval in prometheus.said
    finally:
        prometheus.close()
        server.shutdown()
    assert not prometheus.work.exists()
