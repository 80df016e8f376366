"""A local cluster (`make train-local`, `make bench`: bench.launch) listens on loopback only (issue 47,
item 5): every listening socket its tasks open, read from /proc/net/tcp{,6} while it trains, is on
127.0.0.1, but TensorFlow's own gRPC server on each task's cluster port, which TF 2.21 binds to every
address whatever TF_CONFIG says (`0.0.0.0:<port>` in grpc_server_lib.cc, which gRPC opens as `[::]`;
no ServerDef field, ConfigProto option or environment variable places it). That one is asserted to be
exactly each task's cluster port, so any other listener on another address fails, and a TensorFlow
that starts to honour the host fails too: drop the exception then."""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cluster.local import FIT_MNIST, SCRIPTS

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
LISTEN = "0A"
"""A TCP socket's state in /proc/net/tcp when it listens."""


def _address(hexaddr: str) -> str:
    """/proc/net/tcp's local address (each 32-bit word in host order, little-endian here) -> text."""
    raw = bytes.fromhex(hexaddr)
    ip = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def listeners(pids: list[int]) -> set[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket the processes `pids` listen on."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # exited
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes[link[8:-1]] = pid
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                host, port = fields[1].split(":")
                found.add((inodes[fields[9]], _address(host), int(port, 16)))
    return found


@pytest.mark.parametrize(
    "job",
    [
        ("--steps", "400", "--task", "mlp"),  # make train-local
        (
            "--module",
            "trainer.script.wrapper",
            str(SCRIPTS / "fit_cnn.py"),
            *FIT_MNIST,
            "--epochs",
            "1",
            "--steps-per-epoch",
            "30",
        ),
    ],
    ids=["trainer", "script"],
)
def test_a_local_cluster_listens_on_loopback_only_but_tensorflows_own_port(job):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    cmd = [sys.executable, "-m", "bench.launch", "--workers", "1", *job]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    seen: set[tuple[int, str, int]] = set()
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            tasks = re.findall(
                r"\[launch\] (\S+): pid (\d+), \S+:(\d+), metrics http://([\d.]+):(\d+)", "".join(lines)
            )
            seen |= listeners([int(pid) for _, pid, *_ in tasks])
            time.sleep(0.2)
        assert proc.wait(timeout=5) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(tasks) == 2, "".join(lines)[-3000:]
    metrics = {(int(pid), int(mport)) for _, pid, _, _, mport in tasks}
    assert {(int(pid), where) for _, pid, _, where, _ in tasks} == {(pid, "127.0.0.1") for pid, _ in metrics}
    assert metrics <= {(pid, port) for pid, host, port in seen if host == "127.0.0.1"}, seen
    elsewhere = {(pid, port) for pid, host, port in seen if not ipaddress.ip_address(host).is_loopback}
    tensorflow = {(int(pid), int(port)) for _, pid, port, _, _ in tasks}
    print("listeners seen:", sorted(seen))
    assert elsewhere == tensorflow, (
        f"off loopback: {sorted(elsewhere)}; only TensorFlow's gRPC servers {sorted(tensorflow)} may be"
    )
