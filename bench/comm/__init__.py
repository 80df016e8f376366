"""`make bench-comm`'s host side (`python -m bench.comm`; cli.py says what it measures): where the
sweep's tasks run (endpoints.py), starting them and collecting their timings (tasks.py), the table and
its winners (table.py), the server and allocator A/B (settings.py), iperf3 next to it (iperf.py), the
picture (plot.py). The in-container half is trainer/bench/allreduce_sweep.py; the result file both this
driver and `make diagnose` use is contract/benchcomm.py."""

from bench.comm.cli import main
from bench.comm.endpoints import Endpoint, connections_between, local_endpoints, stack_containers
from bench.comm.iperf import iperf_bytes_per_second, tcp_throughput
from bench.comm.plot import write_png
from bench.comm.settings import ENV_CANDIDATES, SERVER_CANDIDATES, env_setting, server_ab
from bench.comm.table import busbw, format_rounds, format_table, merged_rounds, rows, winner
from bench.comm.tasks import PAYLOADS, _run_sweep, payload_shapes

__all__ = [
    "ENV_CANDIDATES",
    "PAYLOADS",
    "SERVER_CANDIDATES",
    "Endpoint",
    "_run_sweep",
    "busbw",
    "connections_between",
    "env_setting",
    "format_rounds",
    "format_table",
    "iperf_bytes_per_second",
    "local_endpoints",
    "main",
    "merged_rounds",
    "payload_shapes",
    "rows",
    "server_ab",
    "stack_containers",
    "tcp_throughput",
    "winner",
    "write_png",
]
