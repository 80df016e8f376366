"""iperf3 between the first two tasks' network namespaces, with TensorFlow's stream count."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from bench.comm.endpoints import Endpoint, _in_netns


def iperf_bytes_per_second(report: dict) -> float:
    """Receiver-side throughput from `iperf3 -J`."""
    return report["end"]["sum_received"]["bits_per_second"] / 8


def tcp_throughput(server: Endpoint, client: Endpoint, streams: int = 1, port: int = 5201) -> float | None:
    """iperf3 from client to server with `streams` parallel streams (-P), bytes/s; None (with a hint)
    when iperf3 is missing."""
    seconds = 3
    if not server.netns_pid:  # this host's loopback, shared with everything else here
        from bench.launch import free_ports

        port = free_ports(1)[0]

    def cmd(e: Endpoint, *args: str) -> list[str]:
        return _in_netns(e, "iperf3", *args)

    if subprocess.run(["sh", "-c", "command -v iperf3"], capture_output=True).returncode != 0:
        print("bench-comm: iperf3 not found (apt-get install iperf3): no TCP reference", file=sys.stderr)
        return None
    srv = subprocess.Popen(
        cmd(server, "-s", "-1", "-p", str(port)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(50):  # the server is up within ~0.1 s; it accepts exactly one test (-1)
            r = subprocess.run(
                cmd(
                    client,
                    "-c",
                    server.address,
                    "-p",
                    str(port),
                    "-t",
                    str(seconds),
                    "-P",
                    str(streams),
                    "-J",
                ),
                capture_output=True,
                text=True,
                timeout=seconds + 30,
            )
            report = json.loads(r.stdout or "{}")
            if r.returncode == 0 and "error" not in report:
                return iperf_bytes_per_second(report)
            time.sleep(0.1)  # refused: the server is not listening yet
        print(f"bench-comm: iperf3 failed: {r.stdout[-300:]} {r.stderr[-300:]}", file=sys.stderr)
        return None
    finally:
        srv.kill()
        srv.wait()
