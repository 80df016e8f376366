"""The one Prometheus HTTP API client of `make status`, `make diagnose`, `make report`, the scaling
run and the end-to-end tests. Standard library only, so `make status` runs without the venv."""

from __future__ import annotations

import http.client
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

import contract

DEFAULT_URL = f"http://127.0.0.1:{contract.PROMETHEUS_PORT}"


class PrometheusError(RuntimeError):
    """Prometheus did not answer, or answered with an error; the message says which query."""


@dataclass(frozen=True, kw_only=True)
class Prometheus:
    """Prometheus' /api/v1 query endpoints."""

    url: str = DEFAULT_URL
    """Base URL, e.g. DEFAULT_URL."""
    timeout: float = 10.0
    """Seconds per HTTP request."""

    def _get(self, path: str, params: dict) -> dict:
        address = f"{self.url.rstrip('/')}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(address, timeout=self.timeout) as response:
                body = json.load(response)
        except urllib.error.HTTPError as err:  # 400/422/503 carry Prometheus' own error text
            body = _error_body(err)
        except (OSError, ValueError, http.client.HTTPException) as err:  # cut short: a restart
            raise PrometheusError(f"{self.url}: {err}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params.get('query')!r}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """Instant vector: [{"metric": {...}, "value": [t, "v"]}, ...]."""
        params = {"query": expr} | ({"time": at} if at is not None else {})
        return self._get("query", params)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        """Range matrix: [{"metric": {...}, "values": [[t, "v"], ...]}, ...]."""
        return self._get("query_range", {"query": expr, "start": start, "end": end, "step": step})["result"]

    def targets(self, job: str = contract.JOB) -> dict[str, str]:
        """Active scrape targets of `job` as task name -> health (`up`, `down`, `unknown`)."""
        active = self._get("targets", {"state": "active"})["activeTargets"]
        return {contract.task_of(t["labels"]): t["health"] for t in active if t["labels"].get("job") == job}

    def by_task(self, expr: str, at: float | None = None) -> dict[str, float]:
        """Instant vector as task name (contract.task_name) -> value; NaN and ±Inf left out."""
        return by_task(self.query(expr, at))


def _error_body(err: urllib.error.HTTPError) -> dict:
    try:
        return json.load(err)
    except ValueError:
        return {"error": f"HTTP {err.code} {err.reason}"}


def by_task(vector: list[dict]) -> dict[str, float]:
    """An instant-query result keyed by task name, finite values only."""
    out = {}
    for series in vector:
        value = float(series["value"][1])
        if math.isfinite(value):
            out[contract.task_of(series["metric"])] = value
    return out
