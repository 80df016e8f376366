"""make tune's pure parts: which candidates a verdict names, a round's rate from turns, the winner only
beyond the null's spread, the histogram median of a trial, the winner file make up reads."""

import math
import random
import signal
import subprocess
import sys

import pytest

from monitoring.tune import candidates, scrape, table, winner
from monitoring.tune.scrape import Reading
from monitoring.tune.trial import Turn
from monitoring.verdicts import verdict

STOCK = {
    "bytes_per_pack": "0",
    "allreduce_dtype": "float32",
    "allreduce_mode": "serial",
    "steps_per_call": "0",
}


def test_communication_bound_tries_packing_compression_and_overlap():
    names = [k.name for k in candidates.loop_candidates(STOCK, verdict.COMMUNICATION, "all-reduce")]
    assert names == ["BYTES_PER_PACK=1048576", "ALLREDUCE_DTYPE=bfloat16", "ALLREDUCE_MODE=overlap"]


def test_a_setting_already_taken_is_not_tried_again():
    done = {**STOCK, "bytes_per_pack": "1048576", "allreduce_dtype": "bfloat16"}
    assert [k.name for k in candidates.loop_candidates(done, verdict.COMMUNICATION, "all-reduce")] == [
        "ALLREDUCE_MODE=overlap"
    ]


def test_compression_changes_the_optimisation_packing_does_not():
    by = {k.name: k for k in candidates.loop_candidates(STOCK, verdict.COMMUNICATION, "all-reduce")}
    assert by["ALLREDUCE_DTYPE=bfloat16"].changes_optimisation
    assert not by["BYTES_PER_PACK=1048576"].changes_optimisation


def test_given_candidates_parse_and_bad_ones_are_one_line():
    (one, two) = candidates.parse("BYTES_PER_PACK=4096 ALLREDUCE_MODE=overlap+BYTES_PER_PACK=1048576")
    assert one.settings == (("BYTES_PER_PACK", "4096"),)
    assert two.settings == (("ALLREDUCE_MODE", "overlap"), ("BYTES_PER_PACK", "1048576"))
    with pytest.raises(ValueError, match="want NAME=value"):
        candidates.parse("bytes=1")


def _turns(rate, n, turn=1.0, gap=4.0, t0=1000.0):
    """n turns of `turn` s each, `gap` s apart, stepping at `rate` while running."""
    out, step = [], 0.0
    for i in range(n):
        start = t0 + i * (turn + gap)
        step += rate * turn
        out.append(
            Turn(start, start + turn, Reading(step=step, ended=start + turn, loss=0.5, examples=step * 96))
        )
    return out


def test_a_round_counts_only_the_time_its_cluster_ran():
    # stepping at 40/s for 1 s in every 5: 40 steps/s, not 8
    assert table.round_rates(_turns(40, 6), cycles=3) == pytest.approx([40, 40])


def _row(name, ratios):
    return table.Row(name, tuple(ratios), 40, 3840, {}, 0.5)


def test_the_winner_must_clear_the_nulls_spread():
    null = _row(table.NULL, [0.97, 1.03, 1.01])
    assert table.winner([_row("A", [1.20, 1.15, 1.22]), _row("B", [1.05, 1.02, 1.04])], null).name == "A"
    assert table.winner([_row("B", [1.05, 1.02, 1.04])], null) is not None  # above 1.03, every round above 1
    assert table.winner([_row("C", [1.02, 1.06, 0.99])], null) is None  # median 1.02 inside the null


def test_the_null_errs_both_ways():
    """A null whose rounds both fell below 1 still says how far two identical clusters differ: an
    input-capped job's 1.003x (every cluster at its decode's 10.7 steps/s) is no winner (2026-12-06)."""
    null = _row(table.NULL, [0.945, 1.002])
    assert table.bar(null) == pytest.approx(1.055)
    assert table.winner([_row("TF_NUM_INTRAOP_THREADS=1", [1.001, 1.005])], null) is None
    assert table.winner([_row("A", [1.07, 1.06])], null).name == "A"


def test_no_winner_is_invented_when_all_are_within_the_null():
    null = _row(table.NULL, [0.95, 1.05])
    assert table.winner([_row("A", [1.01, 1.04]), _row("B", [0.9, 0.93])], null) is None


def test_histogram_median_between_two_readings():
    a = {0.01: 0, 0.02: 0, 0.05: 0, math.inf: 0}
    b = {0.01: 0, 0.02: 10, 0.05: 10, math.inf: 11}  # ten steps in (10, 20] ms, one stopped for 8 s
    assert 0.01 < scrape.median_between(a, b) <= 0.02


def test_the_trial_chief_is_read_from_its_exposition():
    text = (
        '# TYPE trainer_global_step gauge\ntrainer_global_step{task_type="chief",task_index="0"} 1200\n'
        "# TYPE trainer_last_step_timestamp_seconds gauge\n"
        'trainer_last_step_timestamp_seconds{task_type="chief",task_index="0"} 1.5e9\n'
        '# TYPE trainer_loss gauge\ntrainer_loss{task_type="chief",task_index="0"} 0.25\n'
        "# TYPE trainer_step_duration_seconds histogram\n"
        'trainer_step_duration_seconds_bucket{task_type="chief",task_index="0",le="0.02"} 3\n'
        'trainer_step_duration_seconds_bucket{task_type="chief",task_index="0",le="+Inf"} 4\n'
    )
    r = scrape.parse(text)
    assert (r.step, r.ended, r.loss) == (1200, 1.5e9, 0.25)
    assert r.buckets["step"] == {0.02: 3, math.inf: 4}


def test_the_winner_file_round_trips_and_says_how_to_undo(tmp_path):
    path = winner.write(
        tmp_path, (("ALLREDUCE_DTYPE", "bfloat16"),), "make tune: 1.2x", changes_optimisation=True
    )
    text = path.read_text()
    assert "undo: delete it" in text
    assert winner.read(tmp_path) == {"ALLREDUCE_DTYPE": "bfloat16", "RESUME_NEW_SETTINGS": "1"}
    assert winner.read(tmp_path / "none") == {}


def test_a_script_is_tried_on_what_its_wrapper_controls_and_make_up_gives_the_winner_to_every_task():
    from compose import deployment

    ks = candidates.script_candidates({"allocator": "tuned"}, cores=2)
    assert [k.name for k in ks] == ["allocator=stock", "TF_NUM_INTRAOP_THREADS=1"]
    assert ks[0].settings == (("GLIBC_TUNABLES", ""),)
    taken = {"allocator": "tuned", "intraop_threads": "1", "interop_threads": "1"}  # recorded by its run
    assert [k.name for k in candidates.script_candidates(taken, cores=2)] == ["allocator=stock"]
    # tuned.env -> compose/settings.py's with_tuned: TRAINER_<NAME> -> every task's process environment
    environ = {"TRAINER_" + k: v for k, v in ks[0].settings + ks[1].settings}
    d = deployment.Deployment(workers=1, script="train.py", process=deployment.process_settings(environ))
    env = deployment.trainer_env(d)
    assert (env["GLIBC_TUNABLES"], env["TF_NUM_INTRAOP_THREADS"], env["TF_NUM_INTEROP_THREADS"]) == (
        "",
        "1",
        "1",
    )
    assert "TRAINER_GLIBC_TUNABLES" not in env
    assert deployment.trainer_env(deployment.Deployment(workers=1))["GLIBC_TUNABLES"].startswith(
        "glibc.malloc"
    )


def test_a_script_jobs_host_path_comes_from_its_mounts():
    from monitoring.tune import job

    cmd = [
        "python",
        "-m",
        "trainer.supervise.supervisor",
        "--",
        "python",
        "-m",
        job.WRAPPER,
        "/script/fit.py",
        "--epochs",
        "3",
    ]
    assert job._script(cmd, {"/script": "/home/me/code"}) == ("/home/me/code/fit.py", "--epochs", "3")
    assert job._script(["python", "-m", "trainer"], {}) == ()
    with pytest.raises(job.JobError, match="not in a mount"):
        job._script(cmd, {})


def _use_tuned(tmp_path, text, **environ):
    """compose/up.py's step 0: the winner in tuned.env as TRAINER_<NAME>, each setting not given."""
    from compose import settings

    (tmp_path / "tuned.env").write_text(text)
    env, used = settings.with_tuned(environ, settings.read_tuned(tmp_path / "tuned.env"))
    return {k: v for k, v in env.items() if k.startswith("TRAINER_")}, used


def test_make_up_uses_the_winner_and_says_how_to_undo(tmp_path, capsys):
    from compose import up
    from compose.settings import Settings

    text = winner.lines((("ALLREDUCE_DTYPE", "bfloat16"),), "make tune: 1.2x", changes_optimisation=True)
    env, used = _use_tuned(tmp_path, text)
    assert env == {"TRAINER_ALLREDUCE_DTYPE": "bfloat16", "TRAINER_RESUME_NEW_SETTINGS": "1"}
    assert used == ["ALLREDUCE_DTYPE=bfloat16", "RESUME_NEW_SETTINGS=1"]
    s = Settings(project="p", run_dir=tmp_path, output="", bind_addr="127.0.0.250", gpus="0")
    described, _ = up.check(s, _NoEngine(), {"STEPS": "5", "MAKE_COMMAND_LINE": "STEPS"})
    assert described["TRAINER_ALLREDUCE_DTYPE"] == "bfloat16"
    said = capsys.readouterr().err
    assert "using make tune's winner" in said and "undo: rm" in said
    # the refusals a restart runs first (quiet=True) take the same settings and say nothing
    checked, _ = up.check(s, _NoEngine(), {"STEPS": "5", "MAKE_COMMAND_LINE": "STEPS"}, quiet=True)
    assert checked == described and capsys.readouterr().err == ""


class _NoEngine:
    def query(self, *args):
        return ""


def test_a_setting_given_on_the_command_line_wins_over_the_winner(tmp_path):
    given = {"BYTES_PER_PACK": "4096", "MAKE_COMMAND_LINE": "BYTES_PER_PACK"}
    assert _use_tuned(tmp_path, "BYTES_PER_PACK=1048576\n", **given) == ({}, [])
    assert _use_tuned(tmp_path, "BYTES_PER_PACK=1048576\n", TRAINER_BYTES_PER_PACK="4096") == (
        {"TRAINER_BYTES_PER_PACK": "4096"},
        [],
    )


def test_apply_puts_the_winner_over_the_knobs_the_job_started_with(tmp_path):
    """`make tune APPLY=1` on a job started with `make up INPUT_DELAY_MS=28`: the restart takes the
    winner (INPUT_DELAY_MS=0), not the job's own value, and keeps the job's other knobs. Before
    monitoring/tune/apply.sh the restart was given the job's TRAINER_* environment, which won over tuned.env."""
    from compose import knobs, settings

    started = {"INPUT_DELAY_MS": "28", "STEPS": "5000", "WORKERS": "1", "TRAINER_TASK": "cnn",
               "MAKE_COMMAND_LINE": "INPUT_DELAY_MS STEPS WORKERS"}  # fmt: skip
    settings.record(started, tmp_path / settings.RECORD)
    winner.write(tmp_path, (("INPUT_DELAY_MS", "0"),), "make tune: 4.7x", changes_optimisation=False)
    tuned = settings.read_tuned(tmp_path / settings.TUNED)
    now = {"WORKERS": "3", "MAKE_COMMAND_LINE": ""}
    env, used = settings.with_tuned(
        settings.restart_environ(now, tmp_path / settings.RECORD, tuple(tuned)), tuned
    )
    got = dict(knobs.from_environ(env))
    assert (got["input_delay_ms"], got["steps"], got["task"]) == ("0", "5000", "cnn")
    assert env["WORKERS"] == "3" and used == ["INPUT_DELAY_MS=0"]


def test_a_second_tune_of_the_project_is_one_line_and_exit_2(tmp_path, capsys):
    from compose.projectlock import ProjectLock
    from monitoring.tune.__main__ import main

    with ProjectLock(tmp_path, "make resize PROJECT=p WORKERS=3", "p"):
        assert main(["--project", "p", "--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PROJECT=p is busy: `make resize PROJECT=p WORKERS=3`" in err[0], err


def test_the_trial_clusters_are_stopped_together_once_every_one_steps(tmp_path):
    """Not each as soon as it steps: a SCRIPT= job's clusters keep TensorFlow's 10 s heartbeat, and one
    stopped while the others started was declared dead on its first turn (a cold trial, exit 200). And
    not before each chief has ended a second timed call: the first ones are sized from a step fed by
    prefetched batches (a 103 ms input-bound step's trial made 3.8 s calls, and turns saw no step)."""
    from monitoring.tune import scrape, trial

    said: list[tuple[str, str, int]] = []  # what, to whom, after how many readings of the slow one

    class Starting(trial.Cluster):
        """Ends a call at every reading from the READY-th on."""

        def start(self) -> None:
            self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            self.readings = 0
            said.append(("start", self.name, 0))

        def failed(self) -> str:
            return ""

        def reading(self) -> scrape.Reading:
            self.readings += 1
            return scrape.Reading(step=1, ended=float(max(0, self.readings - READY[self.name] + 1)), loss=1.0)

        def signal(self, sig: int) -> None:
            said.append((signal.Signals(sig).name, self.name, clusters[1].readings))

    READY = {"fast": 1, "slow": 6}
    clusters = [Starting(name) for name in READY]
    try:
        assert trial.start_all(clusters, timeout=60, keep=()) == {}
    finally:
        for c in clusters:
            c.proc.kill()
    assert said == [
        ("start", "fast", 0),
        ("start", "slow", 0),
        ("SIGSTOP", "fast", 7),  # the slow one's first call ended at its 6th reading, the next at its 7th
        ("SIGSTOP", "slow", 7),
    ]


def test_a_candidate_the_trainer_refuses_is_one_line_before_any_trial():
    job_env = {"TRAINER_TASK": "cnn", "TRAINER_LEARNING_RATE": "0.003"}
    (bad,) = candidates.parse("ALLREDUCE_MODE=sideways")
    with pytest.raises(ValueError, match=r"^TUNE_CANDIDATES ALLREDUCE_MODE=sideways: .*allreduce.mode"):
        candidates.check([bad], job_env, script=False)
    candidates.check(candidates.parse("ALLREDUCE_MODE=overlap TF_NUM_INTRAOP_THREADS=1"), job_env, False)
    with pytest.raises(ValueError, match="a SCRIPT= job's script reads no trainer flag"):
        candidates.check(candidates.parse("BYTES_PER_PACK=4096"), {}, script=True)
    candidates.check(candidates.script_candidates({}, cores=2), {}, script=True)
    with pytest.raises(ValueError, match="TF_CPP_MIN_LOG_LEVEL is not a process setting make up can give"):
        candidates.check(candidates.parse("TF_CPP_MIN_LOG_LEVEL=0"), {}, script=True)


def test_a_finished_job_is_not_tuned():
    from monitoring.tune import job
    from monitoring.tune.__main__ import refuse_finished

    with pytest.raises(job.JobError, match="job has finished: nothing to tune"):
        refuse_finished(verdict.FINISHED, "p")
    refuse_finished(verdict.COMMUNICATION, "p")


class FakeDocker:
    """`docker pause/unpause/inspect` of a job's containers: `freezes_after[cid]` pauses of that container
    fail as runc's do on a loaded machine ("unable to freeze", the cgroup thawed back) before one works."""

    FROZE = "OCI runtime pause failed: unable to freeze: unknown"

    def __init__(self, cids, freezes_after=None, status=None):
        self.state = {cid: {"Status": (status or {}).get(cid, "running"), "Paused": False} for cid in cids}
        self.fails = dict(freezes_after or {})
        self.calls = []

    def __call__(self, args):
        from subprocess import CompletedProcess

        verb, cid = args[0], args[-1]
        self.calls.append((verb, cid))
        st = self.state[cid]
        if verb == "inspect":
            return CompletedProcess(args, 0, __import__("json").dumps(st), "")
        if verb == "unpause":
            st["Paused"] = False
            return CompletedProcess(args, 0, cid, "")
        if st["Status"] != "running" or st["Paused"]:
            return CompletedProcess(
                args, 1, "", f"Error response from daemon: Container {cid} is not running"
            )
        if self.fails.get(cid, 0) > 0:
            self.fails[cid] -= 1
            return CompletedProcess(
                args, 1, "", f"Error response from daemon: Cannot pause container {cid}: {self.FROZE}"
            )
        st["Paused"] = True
        return CompletedProcess(args, 0, cid, "")

    def paused(self):
        return {cid for cid, st in self.state.items() if st["Paused"]}


def _job(*cids):
    from monitoring.tune import job

    names = ["chief", *(f"worker-{i}" for i in range(len(cids) - 1))]
    return job.Job("p", dict(zip(names, cids, strict=True)), {}, "img", ())


def test_a_task_that_does_not_freeze_at_once_is_paused_on_a_later_try_never_half_paused_meanwhile():
    """CI, load 4-22: `docker pause` of a task failed ("unable to freeze") and make tune gave up at once."""
    from monitoring.tune import job

    docker, waits, said = FakeDocker(["c", "w0", "w1"], freezes_after={"w1": 2}), [], []
    sleep = lambda s: waits.append((s, set(docker.paused())))  # noqa: E731
    job.pause(_job("c", "w0", "w1"), docker, sleep, said.append)
    assert docker.paused() == {"c", "w0", "w1"}
    assert [s for s, _ in waits] == list(job.PAUSE_WAITS[:2])
    assert all(not paused for _, paused in waits), "the job ran whole while tune waited to try again"
    assert len(said) == 2 and said[0].startswith("tune: the job's task worker-1 did not freeze (docker: ")


def test_a_task_that_never_freezes_is_one_line_and_the_job_runs_as_it_was():
    from monitoring.tune import job

    docker = FakeDocker(["c", "w0"], freezes_after={"w0": 99})
    with pytest.raises(job.JobError) as err:
        job.pause(_job("c", "w0"), docker, sleep=lambda s: None)
    (line,) = str(err.value).splitlines()
    assert line.startswith("could not pause the job's task worker-0 in 6 tries over 31 s (docker: ")
    assert "unable to freeze" in line and "the job goes on as it was" in line
    assert not docker.paused()


def test_a_task_that_stopped_is_not_waited_for_and_an_already_paused_one_counts():
    from monitoring.tune import job

    docker = FakeDocker(["c", "w0"], status={"w0": "exited"})
    with pytest.raises(
        job.JobError, match=r"^the job's task worker-0 is exited, not running: nothing to tune"
    ):
        job.pause(_job("c", "w0"), docker, sleep=lambda s: pytest.fail("no wait for a stopped task"))
    assert not docker.paused()
    left = FakeDocker(["c", "w0"])
    left.state["c"]["Paused"] = True  # a tune killed (SIGKILL) before its finally
    job.pause(_job("c", "w0"), left, sleep=lambda s: None)
    assert left.paused() == {"c", "w0"}
    assert job.unpause(_job("c", "w0"), left, sleep=lambda s: None) == [] and not left.paused()


def test_a_script_whose_examples_are_not_counted_shows_none_not_zero_examples_per_s():
    """A fit script whose batch size is not static counts no examples (the wrapper says so): its table
    showed 0 examples/s, as if nothing trained."""
    split = {p: {1.0: 0.0, math.inf: 0.0} for p in scrape.PARTS}

    def turns(examples_per_step):
        return [
            Turn(
                t.start,
                t.stop,
                Reading(t.reading.step, t.reading.ended, 0.5, split, t.reading.step * examples_per_step),
            )
            for t in _turns(40, 6)
        ]

    base = table.round_rates(turns(0), 3)
    row = table.summary(table.CURRENT, turns(0), 3, base)
    assert row.steps_per_s == pytest.approx(40) and math.isnan(row.examples_per_s)
    line = table.render([], row, table.summary(table.NULL, turns(0), 3, base), None).splitlines()[1]
    assert line.split()[4:6] == ["40.0", "-"], line
    assert table.summary(table.CURRENT, turns(96), 3, base).examples_per_s == pytest.approx(40 * 96)


def test_a_script_that_keeps_no_checkpoint_is_not_tuned_unless_asked():
    """After a tune the job's tasks restart (the pause outlasts TensorFlow's heartbeat): a script that saves
    nothing would train again from its start. The built-in loop always saves; a script that saves is tuned."""
    from subprocess import CompletedProcess

    from monitoring.tune import job

    def volume(listing):
        return lambda args: CompletedProcess(args, 0, listing, "")

    script = job.Job("p", {"chief": "c"}, {}, "img", ("fit.py",))
    with pytest.raises(
        job.JobError, match="keeps no checkpoint in TRAINER_CHECKPOINT_DIR.*TUNE_RESTART_OK=1"
    ):
        job.refuse_unsaved_script(script, False, volume(""))
    job.refuse_unsaved_script(script, False, volume("chief\nworker-0\n"))
    job.refuse_unsaved_script(script, True, volume(""))
    job.refuse_unsaved_script(job.Job("p", {"chief": "c"}, {}, "img", ()), False, volume(""))
    seen = []
    job.holds_checkpoint(script, lambda args: seen.append(args) or CompletedProcess(args, 0, "", ""))
    assert "/c/script" in seen[0][-1], seen  # its own folder (TRAINER_CHECKPOINT_DIR), not the loop's


class _Clock:
    """A virtual clock for monitoring.tune.trial: `sleep` advances it and runs the cluster that holds the turn."""

    def __init__(self) -> None:
        self.now, self.clusters = 1000.0, []

    def time(self) -> float:
        return self.now

    def sleep(self, dt: float) -> None:
        for c in self.clusters:
            c.run(self.now, dt)
        self.now += dt


def _calls_of(seconds: float, clock: _Clock, name: str):
    """A trial cluster whose calls (10 steps each) take `seconds` of its running time."""
    from monitoring.tune import trial

    class Calls(trial.Cluster):
        running, ran, calls, ended = False, 0.0, 0, 0.0

        def signal(self, sig: int) -> None:
            self.running = sig == signal.SIGCONT

        def failed(self) -> str:
            return ""

        def run(self, now: float, dt: float) -> None:
            if self.running:
                self.ran += dt
                while (self.calls + 1) * seconds <= self.ran:
                    self.calls += 1
                    self.ended = now + dt - (self.ran - self.calls * seconds)

        def reading(self) -> Reading:
            return Reading(step=10 * self.calls, ended=self.ended, loss=1.0)

    c = Calls(name)
    clock.clusters.append(c)
    return c


def test_turns_shorter_than_the_calls_are_made_longer_and_nothing_measured_is_one_line(monkeypatch, capsys):
    """4 s calls in 1 s turns: no round of the current settings (or the null) sees two call ends, and the
    table read "no better setting found" with nothing measured (a trial at load 34). The turns double
    until they do; where they cannot grow (a SCRIPT= job's heartbeat), nothing measured is an error."""
    from monitoring.tune import __main__ as tune
    from monitoring.tune import trial

    clock = _Clock()
    monkeypatch.setattr(trial, "time", clock)
    running = [_calls_of(4.0, clock, table.CURRENT), _calls_of(4.0, clock, table.NULL)]
    left = trial.run_turns(running, 1.0, 6, (), random.Random(0))
    assert tune.unmeasured(running, left) == [table.CURRENT, table.NULL]
    with pytest.raises(
        trial.TrialError, match=r"^current, current-again: no call ended within its 1 s turns"
    ):
        tune.measured(running, left, 1.0)  # a script's turns stay 1 s
    turn = tune.longer_turns(running, 1.0, tune.MAX_TURN_S, 6, (), left, random.Random(0))
    assert turn == 2.0 and "no call ended within the turns; again with 2 s turns" in capsys.readouterr().out
    assert tune.unmeasured(running, left) == []
    assert table.round_rates(running[0].turns, tune.CYCLES) == pytest.approx([2.5, 2.5])  # 10 steps / 4 s
    tune.measured(running, left, turn)
