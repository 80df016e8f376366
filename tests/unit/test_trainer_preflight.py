"""Preflight: every peer is probed, missing ones are logged every 10 s and named in the failure."""

import logging
import socket
import threading

import pytest

from trainer.cluster import preflight
from trainer.cluster.spec import ClusterSpec, TaskId
from trainer.errors import FINAL_NOTICE, MissingPeersError, PeerFailedError

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


def test_a_peer_that_failed_for_good_ends_the_wait_at_once_naming_it():
    spec = ClusterSpec(chief=("c:1",), worker=("w0:1", "w1:1"), task=TaskId("chief", 0))
    said = {"w0:1": None, "w1:1": "failed for good: exit 2 (bad configuration: TRAINER_SEED='x')"}
    clock = FakeClock()
    with pytest.raises(PeerFailedError) as err:
        preflight.wait_for_peers(spec, 300, clock=clock, sleep=clock.sleep, probe=said.get)
    assert str(err.value) == (
        "worker-1 (w1:1) failed for good: exit 2 (bad configuration: TRAINER_SEED='x'); ending this task too"
    )
    assert err.value.exit_code == 5 and clock.now == 0


def test_probe_reads_a_final_notice_and_ignores_other_greetings():
    for greeting, said in [
        (
            FINAL_NOTICE + b"4 gave up: restart budget spent\n",
            "failed for good: exit 4 (gave up: restart budget spent)",
        ),
        (b"\x00\x00\x12\x04", None),  # an HTTP/2 server's settings frame: TensorFlow's server is up
    ]:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        thread = threading.Thread(target=lambda s=server, g=greeting: s.accept()[0].sendall(g))
        thread.start()
        try:
            assert preflight.probe(f"127.0.0.1:{port}") == said
        finally:
            thread.join(timeout=5)
            server.close()
