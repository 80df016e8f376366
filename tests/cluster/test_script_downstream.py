"""A user's fit script under the SCRIPT= wrapper as local processes, scraped by a real Prometheus
with the generated rules: `make status` (--no-docker) shows every task's step, progress and ETA, and
`make diagnose` judges it from the sampled split (not NO-DATA, as before trainer/observe)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

import contract
from monitoring import diagnose, status
from monitoring.rules import recording as rules
from tests.cluster.local import FIT_MNIST, SCRIPTS, start_script
from tests.unit.test_monitoring_live import free_port, poll, prometheus_binary  # noqa: F401 (fixture)

SCRIPT = SCRIPTS / "fit_cnn.py"
TASKS = ("chief", "worker-0")


@pytest.fixture(scope="module")
def script_run():
    chief_port = free_port()
    proc = start_script(SCRIPT, chief_port, {"TRAINER_SPLIT_PERIOD_S": "5"}, (*FIT_MNIST, "--epochs", "30"))
    try:
        yield [chief_port, chief_port + 1]
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def prom(prometheus_binary, script_run, tmp_path_factory):  # noqa: F811
    import yaml

    from monitoring.prom.client import Prometheus

    work = tmp_path_factory.mktemp("prometheus")
    rule_files = sorted(str(p) for p in (rules.PROM_DIR / "rules").glob("*.yml"))
    # As the stack's target files do: each target labelled with its task, so `up` names the task.
    targets = [
        {
            "targets": [f"127.0.0.1:{port}"],
            "labels": {
                **dict(zip(contract.LABELS, contract.task_labels(task))),
                # and with the project and run, as the emitters write them (status reads one run)
                contract.PROJECT_LABEL: contract.DEFAULT_PROJECT,
                contract.RUN_LABEL: "script-downstream",
            },
        }
        for task, port in zip(TASKS, script_run, strict=True)
    ]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": rule_files,
        "scrape_configs": [{"job_name": contract.JOB, "honor_labels": True, "static_configs": targets}],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [
            prometheus_binary,
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        yield Prometheus(url=f"http://127.0.0.1:{port}", timeout=5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_status_and_diagnose_on_a_script_run(prom, capsys):
    # The split arrives with the first profiler window: wait for its shares on every task.
    assert poll(prom, rules.SHARE[contract.ALLREDUCE], tasks=len(TASKS), timeout=400).keys() == set(TASKS)
    time.sleep(5)
    assert status.main(["--no-docker", "--prometheus", prom.url]) == 0
    out = capsys.readouterr().out
    print(out)
    col = {name: i for i, name in enumerate(status.COLUMNS)}
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:] if line.split()[0] in TASKS}
    assert rows.keys() == set(TASKS), out
    for task, cells in rows.items():
        assert all(cells[col[k]] != "-" for k in ("step", "progress", "steps/s", "all-reduce", "ETA")), (
            task,
            out,
        )
    assert any(line.startswith("job: step ") and " of 3000 " in line for line in out.splitlines()), out
    capsys.readouterr()  # what print(out) added
    assert diagnose.main(["--prometheus", prom.url, "--json"]) in (0, 1)
    verdict = json.loads(capsys.readouterr().out)
    print(verdict["verdict"], verdict["cluster"]["evidence"])
    assert verdict["verdict"] != "no-data" and set(verdict["tasks"]) == set(TASKS), verdict
