"""Builds beside other make ups (make test's side-by-side stage, two projects from one checkout): one
wheelhouse download per folder at a time; the build context staged only under the build lock (a CPU
build read wheels the GPU image's staging had just emptied: "Got e3b0c442...", the empty file's hash);
one image id for the same code whatever the project (Compose labels the image with the project that
built it: two ids under one tag, and make stack-up's push could not untag the one a container used)."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PIP = """#!/usr/bin/env bash
# `python -m pip download ... -d DIR`: slow enough for a second fetch to start meanwhile.
while [ $# -gt 0 ]; do [ "$1" = -d ] && dir=$2; shift; done
echo run >>"$COUNT"; sleep 1; echo wheel >"$dir/a-1.0-py3-none-any.whl"
"""


def test_two_fetches_side_by_side_download_once_and_leave_a_whole_wheelhouse(tmp_path):
    pip = tmp_path / "python"
    pip.write_text(PIP)
    pip.chmod(0o755)
    lock = tmp_path / "requirements-cpu.lock"
    lock.write_text("a==1.0 --hash=sha256:00\n")
    dest = tmp_path / "build" / "wheelhouse-cpu"
    env = {**os.environ, "PYTHON": str(pip), "COUNT": str(tmp_path / "count"), "LOGS": str(tmp_path / "logs")}
    fetch = [str(ROOT / "images/images.sh"), "fetch", str(lock), str(dest)]
    procs = [subprocess.Popen(fetch, env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0], [p.stderr.read() for p in procs]
    assert (tmp_path / "count").read_text().splitlines() == ["run"]
    assert (dest / "a-1.0-py3-none-any.whl").read_text() == "wheel\n"
    assert (dest / "requirements.lock").read_text() == lock.read_text()


class _Recorder:
    """An engine and subprocess.run stand-in: records each call and whether the build lock was held."""

    def __init__(self, lock: Path) -> None:
        self.lock, self.calls = lock, []

    def _held(self) -> bool:
        with open(self.lock, "a") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(probe, fcntl.LOCK_UN)
            return False

    def __call__(self, cmd, **kw):
        self.calls.append((list(cmd), self._held()))
        return subprocess.CompletedProcess(cmd, 0, "", "")


def _build(tmp_path, monkeypatch, project: str) -> _Recorder:
    from compose import up
    from compose.engine import Engine
    from compose.settings import Settings

    rec = _Recorder(tmp_path / "build.lock")
    monkeypatch.setattr(up, "BUILD_LOCK", rec.lock)
    monkeypatch.setattr(up.subprocess, "run", rec)
    up.build(Settings(project=project, run_dir=tmp_path / project), Engine(run=rec), "cpu")
    return rec


def test_up_stages_the_build_context_under_the_build_lock_only(tmp_path, monkeypatch):
    rec = _build(tmp_path, monkeypatch, "one")
    staged = [held for cmd, held in rec.calls if cmd[1:2] == ["stage"]]
    built = [held for cmd, held in rec.calls if "build" in cmd and "compose" in cmd]
    assert staged == [True] and built == [True], rec.calls
    assert rec.calls[0][0][1:2] == ["stage"], "the build read a context staged before it"


def test_the_image_is_built_under_one_project_whatever_the_stacks(tmp_path, monkeypatch):
    from compose import up

    projects = set()
    for stack in ("one", "two"):
        rec = _build(tmp_path, monkeypatch, stack)
        (build,) = [cmd for cmd, _ in rec.calls if "build" in cmd and "compose" in cmd]
        projects.add(build[build.index("-p") + 1])
    assert projects == {up.BUILD_PROJECT}
