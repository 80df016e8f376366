"""A Prometheus scraping local tasks as the stack's does (`make bench` (f)): Debian's binary on a free
loopback port, with a config of its own in a temporary folder whose `global` section (the scrape
interval and timeout) and trainer job are the stack's own (monitoring/config/prometheus/prometheus.yml),
its targets a file_sd file this module rewrites. No rules, no Alertmanager: what a task pays is the
scrape. Without the binary, `start` returns a no-op that says so (`apt-get install prometheus`)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

import contract
from bench.launch import die_with_parent
from monitoring.rules.recording import PROM_DIR

STACK_CONFIG = PROM_DIR / "prometheus.yml"


def config(targets: Path, stack: dict) -> dict:
    """The stack's global section and trainer job, its file_sd reading `targets` instead."""
    job = next(j for j in stack["scrape_configs"] if j["job_name"] == contract.JOB)
    sd = [{**s, "files": [str(targets)]} for s in job["file_sd_configs"]]
    return {"global": stack["global"], "scrape_configs": [{**job, "file_sd_configs": sd}]}


class NoScrape:
    """No Prometheus: nothing scrapes (the bench says so in its result lines)."""

    def __init__(
        self, said: str = "unscraped (no prometheus binary on PATH: apt-get install prometheus)"
    ) -> None:
        self.said = said

    def targets(self, addresses: list[str]) -> None:
        pass

    def scrapes(self) -> int:
        return 0

    def close(self) -> None:
        pass


class Scrape(NoScrape):
    def __init__(self, binary: str) -> None:
        self.work = Path(tempfile.mkdtemp(prefix="bench-prometheus-"))
        stack = yaml.safe_load(STACK_CONFIG.read_text())
        self.interval = stack["global"]["scrape_interval"]
        self.said = f"scraped every {self.interval} (the stack's interval) by Prometheus"
        self.targets([])
        (self.work / "prometheus.yml").write_text(yaml.safe_dump(config(self.work / "targets.json", stack)))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{s.getsockname()[1]}"
        self.log = (self.work / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.work / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.work / 'data'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,  # a bench killed by a signal leaves no Prometheus behind
        )  # noqa: PLW1509 (only prctl)

    def targets(self, addresses: list[str]) -> None:
        """Scrape these host:port metrics servers from now on (written whole, then renamed)."""
        tmp = self.work / "targets.json.tmp"
        tmp.write_text(json.dumps([{"targets": addresses}] if addresses else []))
        tmp.replace(self.work / "targets.json")

    def scrapes(self) -> int:
        """Successful scrapes of the trainer job so far (the samples of `up` equal to 1)."""
        query = f'sum(sum_over_time(up{{job="{contract.JOB}"}}[1d]))'
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
        try:
            with urllib.request.urlopen(address, timeout=10) as response:
                result = json.load(response)["data"]["result"]
        except (OSError, ValueError, KeyError):
            return 0
        return round(float(result[0]["value"][1])) if result else 0

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)


def start(binary: str | None = None) -> NoScrape:
    found = binary or shutil.which("prometheus")
    return Scrape(found) if found else NoScrape()
