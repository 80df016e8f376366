"""bench/script_overhead.py runs each setting's cluster in turns and rates each by the time it ran:
the epochs that ended during the turns, over the turns' seconds between the first and the last."""

import pytest

from bench import script_overhead as so


def test_active_seconds_counts_only_the_turns_inside_the_window():
    turns = [(0.0, 1.0), (2.0, 3.0), (4.0, 5.0)]
    assert so.active_seconds(turns, 0.5, 4.5) == pytest.approx(0.5 + 1.0 + 0.5)
    assert so.active_seconds(turns, 1.0, 2.0) == 0.0


def test_a_cluster_is_rated_by_the_time_it_ran_not_the_time_that_passed():
    """Epoch lines at 1.0 (before the turns: tracing together), 2.5, 6.5, 10.5; turns of 1 s every
    2 s from 2.0: between 2.5 and 10.5 it ran 4 s of 8, for 200 steps."""
    turns = [(2.0 + 2 * i, 3.0 + 2 * i) for i in range(5)]
    epochs = [(1.0, 9.0), (2.5, 1.0), (6.5, 2.0), (10.5, 3.0)]
    run = so.sliced_run(epochs, turns, end=12.0, steps_per_epoch=100)
    assert run.rate == pytest.approx(200 / 4.0)
    assert run.cpu_ms == pytest.approx(1e3 * 5.0 / 200)


def test_epochs_after_the_turns_ended_are_not_counted():
    turns = [(0.0, 1.0), (2.0, 3.0)]
    epochs = [(0.5, 1.0), (2.5, 1.0), (5.0, 1.0)]  # the last ran freely after the turns ended at 3.0
    assert so.sliced_run(epochs, turns, end=3.0, steps_per_epoch=100).rate == pytest.approx(100 / 1.0)


def test_too_few_epochs_in_the_turns_is_an_error_naming_the_fix():
    with pytest.raises(RuntimeError, match="raise --epochs"):
        so.sliced_run([(0.5, 1.0)], [(0.0, 1.0)], end=1.0, steps_per_epoch=100)


def test_the_epoch_line_and_the_launchers_pid_line_are_read():
    m = so.EPOCH.match("[chief] epoch 3 done, loss 0.5000, 2.000 s, 3.000 s CPU")
    assert m and m.group(1) == "3" and m.group(3) == "3.000"
    assert not so.EPOCH.match("[worker-0] epoch 3 done, loss 0.5000, 2.000 s, 3.000 s CPU")
    pid = so.PID.match("[launch] worker-0: pid 4242, 127.0.0.1:1234, metrics off")
    assert pid and pid.group(1) == "4242" and pid.group(2, 3) == ("127.0.0.1", "1234")
    assert pid.group(4) is None
    served = so.PID.match("[launch] chief: pid 4243, 127.0.0.1:1235, metrics http://127.0.0.1:5678/metrics")
    assert served and served.group(4) == "127.0.0.1:5678"  # what the Prometheus scrapes


def test_a_cluster_is_listening_once_every_tasks_port_accepts():
    """The next cluster is started only then: launchers started together drew the same free port."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    bound = server.getsockname()
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    unbound = free.getsockname()
    free.close()
    c = object.__new__(so.Cluster)
    c.tasks, c.ports = 2, [bound]
    assert not c.listening()  # one task's line not read yet
    c.ports = [bound, unbound]
    assert not c.listening()
    c.ports = [bound, bound]
    assert c.listening()
    server.close()


def test_a_cluster_that_ended_before_its_turns_is_an_error_not_a_wait_forever():
    """The round waits for every cluster's tracing epoch; one that exited 0 without printing it (a
    script that changed its output) would keep that wait going for ever."""

    class Ended:
        def poll(self):
            return 0

    cluster = object.__new__(so.Cluster)
    cluster.variant, cluster.proc, cluster.log = "plain", Ended(), ["[chief] done\n"]
    cluster.check()  # exit 0 after the turns: fine
    with pytest.raises(RuntimeError, match="exited 0 \\(before its turns: True\\)"):
        cluster.check(running=True)


def test_every_steps_per_execution_is_measured_and_the_null_runs_by_default(monkeypatch):
    """Keras' default (1 step per call, where the hooks' per-call work weighs most) and 10, each in
    rounds of its own, with the second plain cluster beside them: the method's null."""
    seen = []

    def measure(k, variants, args, prometheus):
        seen.append((k, variants, args.steps_per_execution))
        return [f"(f) steps_per_execution {k}"]

    monkeypatch.setattr(so, "measure", measure)
    assert so.main(["--no-scrape"]) == 0
    assert seen == [(1, ["observed", "plain-again"], "1,10"), (10, ["observed", "plain-again"], "1,10")]
    with pytest.raises(SystemExit):
        so.main(["--no-scrape", "--steps-per-execution", "0"])
