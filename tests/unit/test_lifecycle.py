"""compose/lifecycle.py and its parts: the project lock, what clean keeps, the settings a restart takes.
The engine is compose/engine.py's `Engine` with a fake `run`: nothing reaches Docker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from compose import keep, lifecycle, settings
from compose.engine import Engine
from compose.projectlock import LockHeld, ProjectLock
from compose.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


class FakeDocker:
    """`run` for Engine: answers from a table keyed by the first docker words, records every call."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, str, str]] | None = None) -> None:
        self.answers, self.calls = answers or {}, []

    def __call__(self, cmd, **kw):
        self.calls.append(cmd[1:])
        for n in (3, 2, 1):
            if tuple(cmd[1 : 1 + n]) in self.answers:
                code, out, err = self.answers[tuple(cmd[1 : 1 + n])]
                return subprocess.CompletedProcess(cmd, code, out, err)
        return subprocess.CompletedProcess(cmd, 0, "", "")


# --- One lock per project ---


def test_a_second_command_names_the_holder_and_since_when(tmp_path):
    with ProjectLock(tmp_path, "make resize PROJECT=p WORKERS=3", "p"):
        with pytest.raises(LockHeld) as held:
            ProjectLock(tmp_path, "make up PROJECT=p", "p").acquire()
    line = str(held.value)
    assert "\n" not in line and "`make resize PROJECT=p WORKERS=3`" in line and f"pid {os.getpid()}" in line
    assert "since 20" in line
    ProjectLock(tmp_path, "make up PROJECT=p", "p").acquire().release()  # free again once released


def test_a_lock_whose_holder_died_is_taken_over_and_said(tmp_path):
    code = "from compose.projectlock import ProjectLock; import os\n"
    code += f"ProjectLock({str(tmp_path)!r}, 'make tune', 'p').acquire(); os._exit(9)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 9
    said = []
    ProjectLock(tmp_path, "make up", "p", say=said.append).acquire().release()
    assert len(said) == 1 and "took over" in said[0] and "`make tune`" in said[0], said


def test_every_command_that_changes_the_job_takes_the_lock(tmp_path, capsys):
    environ = {"PROJECT": "p", "RUN_DIR": str(tmp_path), "WORKERS": "3", "MAKE_COMMAND_LINE": "WORKERS"}
    with ProjectLock(tmp_path, "make tune PROJECT=p", "p"):
        for command in ("up", "down", "clean", "resize", "apply-tuned"):
            assert lifecycle.main([command], environ) == 2, command
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "PROJECT=p is busy: `make tune PROJECT=p`" in err[0], (command, err)


# --- make clean keeps what it promises ---


def _finished_job(tmp_path: Path, output: Path, with_stack_env: bool = True) -> Settings:
    run_dir = tmp_path / ".run"
    run_dir.mkdir()
    output.mkdir(parents=True)
    (output / "summary.json").write_text("{}")
    for name in ("compose.args", "compose.base.yaml", "up.json"):
        (run_dir / name).write_text("x")
    (run_dir / "targets").mkdir()
    if with_stack_env:
        (run_dir / "stack.env").write_text(f"COMPOSE_PROJECT_NAME=p\nOUTPUT={output.resolve()}\n")
    return Settings(project="p", run_dir=run_dir, output="")


def test_clean_keeps_an_output_folder_inside_the_run_folder(tmp_path):
    """`make up OUTPUT=.run/final`, a finished job, `make clean`: the folder was removed with the rest."""
    s = _finished_job(tmp_path, tmp_path / ".run" / "final")
    removed = {p.name for p in keep.removable(s)}
    assert removed == {"compose.args", "compose.base.yaml", "up.json", "targets", "stack.env"}


def test_clean_keeps_other_projects_swarm_stacks_and_models_without_stack_env(tmp_path):
    s = _finished_job(tmp_path, tmp_path / "elsewhere", with_stack_env=False)
    other = s.run_dir / "other-project"
    other.mkdir()
    (other / ".lock").write_text("")
    (s.run_dir / "swarm" / "mwms").mkdir(parents=True)
    model = s.run_dir / "copied" / "model"
    model.mkdir(parents=True)
    (model / "saved_model.pb").write_bytes(b"")
    removed = {p.name for p in keep.removable(s)}
    assert removed == {"compose.args", "compose.base.yaml", "up.json", "targets"}


def test_clean_asks_the_volume_for_an_uncopied_model_even_without_stack_env(tmp_path):
    """The FORCE guard ran only when stack.env existed: a fresh clone, or `rm -rf .run`, lost the model."""
    s = Settings(project="p", run_dir=tmp_path / "nothing-here")
    line = "the checkpoint volume holds a final model that was never copied out: `make output` copies it"
    fake = FakeDocker({("run",): (2, "", line)})
    assert keep.uncopied_model(s, Engine(run=fake)) == line
    assert ["volume", "inspect", "p_checkpoints"] in fake.calls
    assert (
        keep.uncopied_model(s, Engine(run=FakeDocker({("volume", "inspect"): (1, "", "no such volume")})))
        is None
    )
    missing = FakeDocker({("image", "inspect"): (1, "", "no such image")})
    assert "FORCE=1" in keep.uncopied_model(s, Engine(run=missing))


def test_clean_refuses_and_removes_nothing(tmp_path, monkeypatch):
    s = _finished_job(tmp_path, tmp_path / "out")
    monkeypatch.setattr(keep, "uncopied_model", lambda s, eng: "a final model was never copied out")
    with pytest.raises(lifecycle.Refused):
        lifecycle.clean(s, Engine(run=FakeDocker()))
    assert (s.run_dir / "stack.env").exists() and (s.run_dir / "up.json").exists()


# --- Settings, parsed once; what a restart takes ---


def test_settings_refuse_a_bad_value_in_one_line_naming_make_s_variable():
    for environ, named in (({"WORKERS": "two"}, "WORKERS='two'"), ({"PROJECT": "x; touch p"}, "PROJECT='x; touch p'"),
                           ({"MAX_RESTARTS": "1\nrm"}, "MAX_RESTARTS='1\\nrm'")):  # fmt: skip
        with pytest.raises(ValueError) as err:
            Settings.parse(environ)
        assert "\n" not in str(err.value) and str(err.value).startswith(named), err.value


def test_output_defaults_per_project_and_an_empty_one_given_means_none():
    assert Settings.parse({"PROJECT": "p"}).output == ".run/output/p"
    assert Settings.parse({"PROJECT": "p", "OUTPUT": "", "MAKE_COMMAND_LINE": "OUTPUT"}).output == ""
    assert Settings.parse({"PROJECT": "p"}).run_dir == Path(".run/p")


def test_a_resize_starts_the_job_again_with_its_own_settings_at_the_new_size(tmp_path):
    started = {"STEPS": "900", "TASK": "mlp", "WORKERS": "1", "TRAINER_INPUT_DELAY_MS": "20",
               "MAKE_COMMAND_LINE": "STEPS TASK WORKERS"}  # fmt: skip
    settings.record(started, tmp_path / settings.RECORD)
    env = settings.restart_environ(
        {"WORKERS": "3", "MAKE_COMMAND_LINE": "WORKERS"}, tmp_path / settings.RECORD
    )
    assert (env["STEPS"], env["TASK"], env["WORKERS"], env["TRAINER_INPUT_DELAY_MS"]) == (
        "900",
        "mlp",
        "3",
        "20",
    )
    assert env["MAKE_COMMAND_LINE"].split() == ["STEPS", "TASK", "WORKERS"]
    assert Settings.parse(env).workers == 3


def test_a_restart_without_the_record_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="up.json is missing: make down, then make up"):
        settings.restart_environ({}, tmp_path / settings.RECORD)


def test_apply_restarts_at_the_size_the_job_has_now(tmp_path, monkeypatch):
    """make tune read the size at its start: a resize in between was undone. The lock now keeps them
    apart, and the winner is applied at the size the stack's files have when it is applied."""
    s = Settings(project="p", run_dir=tmp_path)
    (tmp_path / "tuned.env").write_text("ALLREDUCE_DTYPE=bfloat16\n")
    settings.record({"STEPS": "900", "MAKE_COMMAND_LINE": "STEPS"}, tmp_path / settings.RECORD)
    seen = {}
    monkeypatch.setattr(lifecycle, "restart", lambda s, eng, env, who: seen.update(env) or 0)
    fake = FakeDocker({("compose",): (0, "chief\nworker-0\nworker-1\nworker-2\nprometheus\n", "")})
    assert lifecycle.apply_tuned(s, Engine(run=fake), {"PROJECT": "p"}) == 0
    assert seen["WORKERS"] == "3" and seen["STEPS"] == "900" and "ALLREDUCE_DTYPE" not in seen


# --- The Target protocol: deploy and undeploy where the target has an engine ---


def test_every_target_deploys_or_says_in_one_line_how(tmp_path):
    from compose import targets

    fake = FakeDocker({("exec",): (0, "true\n", "")})
    place = targets.Place("p", tmp_path, "sw", 3)
    for name in targets.names():
        target = targets.load(name)
        if name in ("compose", "swarm"):
            target.deploy(place, Engine(run=fake))
            target.undeploy(place, Engine(run=fake))
            continue
        with pytest.raises(targets.NotDeployable) as err:
            target.deploy(place, Engine(run=fake))
        assert "\n" not in str(err.value) and "kubectl apply" in str(err.value)
    compose_calls = [c for c in fake.calls if c[:1] == ["compose"]]
    assert any("up" in c and "-d" in c for c in compose_calls) and any("down" in c for c in compose_calls)
    assert any("deploy" in c and c[-1] == "p" for c in fake.calls if c[:1] == ["exec"])
    assert ["exec", "sw-node-1", "docker", "stack", "rm", "p"] in fake.calls


def test_a_stack_resize_while_stack_elastic_runs_is_one_line_naming_it(tmp_path, capsys):
    from compose import stackresize

    bundle = tmp_path / "s"  # SWARM_DIR: .run/swarm/STACK
    with ProjectLock(bundle, "make stack-elastic STACK=s", "s", label="STACK"):
        assert stackresize.main(["--dir", str(bundle), "--workers", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "STACK=s is busy: `make stack-elastic STACK=s`" in err[0], err


def test_no_host_tool_runs_docker_but_the_engine_adapter():
    """Every docker, compose and swarm call of compose/ and monitoring/ goes through compose/engine.py:
    no subprocess call there is handed a command starting with "docker"."""
    import ast

    found = []
    for folder in ("compose", "monitoring"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "engine.py" and folder == "compose":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                owner = node.func.value
                if not (isinstance(owner, ast.Name) and owner.id == "subprocess" and node.args):
                    continue
                first = node.args[0]
                head = first.elts[0] if isinstance(first, (ast.List, ast.Tuple)) and first.elts else None
                if isinstance(head, ast.Constant) and head.value == "docker":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"docker run outside compose/engine.py: {found}"


def test_make_images_checks_the_job_with_its_output_folder_made(tmp_path):
    """make images (up's build-only path) of a project whose OUTPUT folder does not exist yet: the
    emitter refused it ("does not exist"), so the engine-fault tests' `make images` failed."""
    from compose import up

    s = Settings(project="p", run_dir=tmp_path / "run", output=str(tmp_path / "out"))
    _, described = up.check(s, Engine(run=FakeDocker()), {}, starting=False)
    assert (tmp_path / "out").is_dir() and described.deployment.output == str(tmp_path / "out")


def test_a_holder_that_exits_normally_leaves_nothing_to_take_over(tmp_path):
    """make tune holds the lock until it ends: the next command said it "took over" from it."""
    code = f"from compose.projectlock import ProjectLock\nProjectLock({str(tmp_path)!r}, 'make tune', 'p').acquire()"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
    said = []
    ProjectLock(tmp_path, "make up", "p", say=said.append).acquire().release()
    assert said == []
