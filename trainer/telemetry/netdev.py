"""Network byte counters of this process's network namespace, read from /proc/net/dev at scrape time.

In a container the namespace is the container's, so these are that task's own bytes on the wire
(the gradient all-reduce, mostly). Loopback is left out: on a host it is not the cluster's traffic
that crosses a link, and inside a container it is local chatter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

import contract

PROC_NET_DEV = "/proc/net/dev"


def parse(text: str, skip: tuple[str, ...] = ("lo",)) -> tuple[int, int]:
    """(received, transmitted) bytes summed over interfaces; see proc(5) for the layout."""
    rx = tx = 0
    for line in text.splitlines()[2:]:
        name, sep, fields = line.partition(":")
        if not sep or name.strip() in skip:
            continue
        cols = fields.split()
        rx += int(cols[0])
        tx += int(cols[8])
    return rx, tx


def read_proc(path: str = PROC_NET_DEV) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError:  # not Linux: report zeros rather than fail the scrape
        return ""


class NetworkCollector(Collector):
    """contract.NET_RECEIVE and NET_TRANSMIT for one task."""

    def __init__(self, labels: Mapping[str, str], read: Callable[[], str] = read_proc) -> None:
        self._labels = dict(labels)
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        rx, tx = parse(self._read())
        names = list(self._labels)
        values = list(self._labels.values())
        for metric, value in ((contract.NET_RECEIVE, rx), (contract.NET_TRANSMIT, tx)):
            family = CounterMetricFamily(metric.client_name, f"{metric.help} (no loopback)", labels=names)
            family.add_metric(values, value)
            yield family


class LabelledCollector(Collector):
    """Adds fixed labels to every sample of another collector (e.g. ProcessCollector)."""

    def __init__(self, inner: Collector, labels: Mapping[str, str]) -> None:
        self._inner = inner
        self._labels = dict(labels)

    def collect(self) -> Iterator:
        for family in self._inner.collect():
            family.samples = [s._replace(labels={**s.labels, **self._labels}) for s in family.samples]
            yield family
