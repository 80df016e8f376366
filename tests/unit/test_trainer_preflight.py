"""Preflight: every peer is probed, missing ones are logged every 10 s and named in the failure."""

import logging
import socket

import pytest

from trainer import preflight
from trainer.cluster import ClusterSpec, TaskId
from trainer.errors import MissingPeersError

SPEC = ClusterSpec(chief=("chief:2222",), worker=("worker-0:2222", "worker-1:2222"), task=TaskId("chief", 0))


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += max(seconds, 0.5)


def test_returns_when_all_answer():
    clock = FakeClock()
    preflight.wait_for_peers(SPEC, 300, clock=clock, sleep=clock.sleep, probe=lambda addr: None)
    assert clock.now == 0


def test_missing_peer_named_after_timeout_and_logged_every_10s(caplog):
    clock = FakeClock()
    caplog.set_level(logging.INFO)

    def probe(addr):
        return "connection refused" if addr == "worker-1:2222" else None

    with pytest.raises(MissingPeersError) as err:
        preflight.wait_for_peers(SPEC, 30, clock=clock, sleep=clock.sleep, probe=probe)
    assert "worker-1 (worker-1:2222): connection refused" in str(err.value)
    assert "worker-0" not in str(err.value)
    assert err.value.exit_code == 3
    waits = [r.message for r in caplog.records if r.message.startswith("waiting for")]
    assert len(waits) == 2 and "worker-1 (worker-1:2222): connection refused, 10s/30s" in waits[0]
    assert clock.now <= 31


def test_peer_that_comes_up_late_is_accepted():
    clock = FakeClock()
    preflight.wait_for_peers(
        SPEC,
        300,
        clock=clock,
        sleep=clock.sleep,
        probe=lambda addr: None if clock.now > 20 else "connection refused",
    )
    assert 20 < clock.now < 22


def test_probe_real_sockets():
    listener = preflight.Listener(0)
    port = listener._sock.getsockname()[1]
    try:
        assert preflight.probe(f"127.0.0.1:{port}") is None
    finally:
        listener.close()
    assert preflight.probe(f"127.0.0.1:{port}") == "connection refused"
    assert preflight.probe("no-such-host.invalid:1") == "name does not resolve"


def test_listener_releases_port_for_reuse():
    listener = preflight.Listener(0)
    port = listener._sock.getsockname()[1]
    preflight.probe(f"127.0.0.1:{port}")
    listener.close()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", port))  # what TensorFlow's server does next
    s.close()
