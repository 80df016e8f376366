"""Builds beside other make ups (make test's side-by-side stage, two projects from one checkout): one
wheelhouse download per folder at a time; the build context staged only under the build lock (a CPU
build read wheels the GPU image's staging had just emptied: "Got e3b0c442...", the empty file's hash);
one image id for the same code whatever the project (Compose labels the image with the project that
built it: two ids under one tag, and make stack-up's push could not untag the one a container used)."""

from __future__ import annotations

import os
import re
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


def test_up_stages_the_build_context_under_the_build_lock_only():
    lines = (ROOT / "compose/up.sh").read_text().splitlines()
    code = [ln.split("#", 1)[0] for ln in lines]
    staged = [i for i, ln in enumerate(code) if re.search(r"images\.sh\"? stage\b", ln)]
    locked = next(i for i, ln in enumerate(code) if re.fullmatch(r"\s*flock 8\s*", ln))
    released = next(i for i, ln in enumerate(code) if "flock -u 8" in ln)
    built = next(i for i, ln in enumerate(code) if "build_chief" in ln and "quietly" in ln)
    assert len(staged) == 1 and locked < staged[0] < built < released, (staged, locked, built, released)
    assert not any(re.search(r"images\.sh\"? wheelhouse\b", ln) for ln in code), "stages outside the lock"


def test_the_image_is_built_under_one_project_whatever_the_stacks():
    code = [ln.split("#", 1)[0] for ln in (ROOT / "compose/up.sh").read_text().splitlines()]
    build = next(ln for ln in code if re.match(r"\s*build_chief\(\)", ln))
    fixed = next(ln for ln in code if ln.startswith("BUILD_PROJECT="))
    assert '-p "$BUILD_PROJECT"' in build and "$" not in fixed.split("=", 1)[1], (build, fixed)
