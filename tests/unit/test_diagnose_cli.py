"""monitoring/diagnose.py: Prometheus answers -> samples -> text / JSON / exit code, against a fake
Prometheus HTTP API on loopback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

import contract
from contract.benchcomm import Result, Row
from monitoring import diagnose
from monitoring.rules import recording as rules
from monitoring.verdicts import verdict

ROOT = Path(__file__).resolve().parents[2]
RUN = "20261201T090000Z"
QUERIES = diagnose.queries(rules.selector(contract.DEFAULT_PROJECT, RUN))
"""What diagnose asks once it has found the project's latest run (RUN)."""


def vec(name: str, value: float | str, /, **labels: str) -> dict:
    task_type, index = contract.task_labels(name)
    return {
        "metric": {
            "job": "trainer",
            "project": contract.DEFAULT_PROJECT,
            "run": RUN,
            "task_type": task_type,
            "task_index": index,
            **labels,
        },
        "value": [1000.0, str(value)],
    }


def healthy(tasks=("chief", "worker-0", "worker-1"), **override) -> dict[str, list[dict]]:
    build = dict(
        tf_version="2.21.0", trainer_version="0.1.0", strategy="mwms", communication="AUTO", task="mlp"
    )
    figures = {
        "up": 1,
        "last_step_age": 1.5,
        "step": 0.1,
        "compute": 0.07,
        "compute_share": 0.7,
        "allreduce_share": 0.2,
        "input_share": 0.05,
        "busbw": 4e7,
        "world_size": 3,
    }
    out = {name: [vec(t, value) for t in tasks] for name, value in figures.items()}
    out["state"] = [vec(t, 1, trainer_state="training") for t in tasks]
    out["build"] = [vec(t, 1, **build) for t in tasks]
    for name, per_task in override.items():
        for t, value in per_task.items():
            out[name] = [s for s in out[name] if contract.task_of(s["metric"]) != t] + [vec(t, value)]
    return out


def test_samples_from_vectors():
    samples = diagnose.samples(healthy(input_share={"worker-1": "NaN"}))
    assert [s.task for s in samples] == ["chief", "worker-0", "worker-1"]
    chief = samples[0]
    assert (chief.up, chief.state, chief.world_size, chief.compute) == (True, "training", 3, 0.07)
    assert chief.build == ("2.21.0", "0.1.0", "mwms", "AUTO", "mlp")
    assert samples[2].input_share is None, "NaN (0/0 when no step in the window) is unknown, not a number"


def test_a_task_ended_as_stuck_is_named_with_its_step_and_where_its_stack_is():
    results = healthy()
    results["stuck_step"] = [vec("worker-1", 160)]
    results["stuck_age"] = [vec("worker-1", 42.0)]
    d = verdict.diagnose(diagnose.samples(results))
    assert (d.cluster.verdict, d.cluster.tasks, d.exit_code) == ("stuck", ("worker-1",), 1)
    text = diagnose.render(d)
    assert "worker-1: ended as stuck at step 160 42 s ago" in text
    assert "make logs SERVICE=worker-1" in text
    # Once the job is over: finished, and still said.
    done = dict(results)
    done["state"] = [vec(t, 1, trainer_state="done") for t in ("chief", "worker-0", "worker-1")]
    d = verdict.diagnose(diagnose.samples(done))
    assert d.cluster.verdict == "finished" and "ended as stuck at step 160" in diagnose.render(d)


def test_series_of_tasks_no_longer_scraped_are_ignored():
    results = healthy()
    results["step"].append(vec("worker-7", 0.1))
    assert [s.task for s in diagnose.samples(results)] == ["chief", "worker-0", "worker-1"]


class FakePrometheus(BaseHTTPRequestHandler):
    answers: dict[str, list[dict]] = {}

    def do_GET(self):
        expr = parse_qs(urlparse(self.path).query)["query"][0]
        if expr.startswith(f"count by ({contract.RUN_LABEL})"):  # monitoring.runs: the latest run
            result = [{"metric": {"run": RUN}, "value": [1000.0, "3"]}] if self.answers else []
        else:
            result = self.answers.get(next((n for n, e in QUERIES.items() if e == expr), ""), [])
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def prometheus():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_straggler_is_named_with_exit_1(prometheus, capsys, tmp_path):
    FakePrometheus.answers = healthy(compute={"worker-0": 0.21})
    code = diagnose.main(["--prometheus", prometheus, "--bench", str(tmp_path / "none.json")])
    out = capsys.readouterr().out
    assert code == 1
    assert out.startswith("cluster: STRAGGLER (worker-0)\n  - worker-0 computes 3.0x the others")
    assert "advice:" in out and "worker-0  straggler" in out


def test_healthy_json_exit_0(prometheus, capsys, tmp_path):
    FakePrometheus.answers = healthy()
    code = diagnose.main(["--prometheus", prometheus, "--json", "--bench", str(tmp_path / "none.json")])
    out = json.loads(capsys.readouterr().out)
    assert (code, out["verdict"], out["code"], out["exit_code"]) == (0, "healthy", 0, 0)
    assert set(out["tasks"]) == {"chief", "worker-0", "worker-1"}


def bench_result(*rows: tuple[str, int, float]) -> Result:
    return Result(
        where="local processes",
        n=2,
        tf_version="2.21.0",
        tcp=1e9,
        rows=tuple(Row(variant, size, size / busbw, busbw, busbw) for variant, size, busbw in rows),
    )


def test_bench_comm_result_is_the_reference(prometheus, capsys, tmp_path):
    bench = tmp_path / "bench-comm.json"
    bench_result(("RING/0", 256 << 10, 7e7), ("RING/1MiB", 256 << 10, 8e7), ("RING/0", 64 << 20, 5e8)).write(
        bench
    )
    FakePrometheus.answers = healthy(allreduce_share={t: 0.7 for t in ("chief", "worker-0", "worker-1")})
    FakePrometheus.answers["allreduce_bytes"] = [vec(t, 300_000) for t in ("chief", "worker-0", "worker-1")]
    assert diagnose.main(["--prometheus", prometheus, "--bench", str(bench)]) == 1
    assert "50% of the 80 MB/s `make bench-comm` measured for 256 KiB" in capsys.readouterr().out


def test_bench_reference_without_gradient_size_is_the_overall_best(tmp_path):
    bench = tmp_path / "bench-comm.json"
    bench_result(("RING/0", 4 << 10, 1e6), ("RING/0", 64 << 20, 5e8)).write(bench)
    assert diagnose.link_reference(bench, None) == (5e8, 64 << 20)
    assert diagnose.link_reference(tmp_path / "missing.json", 1e6) == (None, None)


def test_an_unreadable_bench_result_is_named_and_ignored(tmp_path, capsys):
    bench = tmp_path / "bench-comm.json"
    bench.write_text(json.dumps({"best": {"busbw": 5e8, "size": 64 << 20}, "rows": []}))  # before the schema
    assert diagnose.link_reference(bench, 1e6) == (None, None)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "schema None" in err and "run `make bench-comm` again" in err


def test_bench_result_round_trips(tmp_path):
    result = bench_result(("RING/0", 4 << 10, 1e6), ("RING/0", 64 << 20, 5e8))
    result.write(tmp_path / "r.json")
    assert Result.read(tmp_path / "r.json") == result
    assert json.loads((tmp_path / "r.json").read_text())["best"]["busbw"] == 5e8


def test_no_targets_exit_2(prometheus, capsys):
    FakePrometheus.answers = {}
    assert diagnose.main(["--prometheus", prometheus]) == 2
    assert "NO-DATA" in capsys.readouterr().out


def test_unreachable_prometheus_exit_2(capsys):
    assert diagnose.main(["--prometheus", "http://127.0.0.1:9"]) == 2
    assert "cannot query Prometheus" in capsys.readouterr().err


def test_unreachable_prometheus_still_gives_json_to_a_script(capsys):
    """JSON=1 is for scripts: a Prometheus that does not answer yet (a stack just started) is no-data
    in JSON too, not an empty stdout a script fails to parse (CI's test_runs did, right after `make up`)."""
    assert diagnose.main(["--prometheus", "http://127.0.0.1:9", "--json"]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["verdict"] == "no-data" and doc["exit_code"] == 2 and doc["tasks"] == {}
    assert "cannot query Prometheus" in doc["error"] and "cannot query Prometheus" in err


# The verdict rules' promtool unit tests run with every other rule test in test_monitoring_rules.py.


def make_diagnose(prometheus: str, *extra: str, terminal: bool) -> tuple[int, str]:
    """`make diagnose` as a person runs it (stdout a terminal: a pty) or as a script does (a pipe)."""
    import os
    import pty
    import subprocess

    cmd = ["make", "--no-print-directory", "diagnose", f"PROMETHEUS_URL={prometheus}", "RUN=", *extra]
    if not terminal:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        return done.returncode, done.stdout + done.stderr
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=follower, stderr=follower, stdin=subprocess.DEVNULL)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: every writer closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=120), b"".join(chunks).decode(errors="replace")


def test_a_problem_in_a_terminal_is_no_make_error_and_scripts_keep_the_code(prometheus):
    FakePrometheus.answers = healthy(compute={"worker-0": 0.21})
    code, out = make_diagnose(prometheus, terminal=True)
    assert code == 0 and "STRAGGLER" in out and "make: ***" not in out, out
    assert "scripts get exit_code 1" in out
    assert make_diagnose(prometheus, terminal=False)[0] != 0  # make exits 2 for any failed recipe
    code, out = make_diagnose(prometheus, "JSON=1", terminal=True)
    assert code != 0 and '"exit_code": 1' in out, out
