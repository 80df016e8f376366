"""SCRIPT= and DATA= must be readable by the containers' user (uid 1000) before any container starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compose import emit, mounts


def script_in(folder: Path, *, folder_mode: int, file_mode: int = 0o644, owner: int | None = None) -> Path:
    folder.mkdir()
    script = folder / "train.py"
    script.write_text("print('hi')\n")
    script.chmod(file_mode)
    folder.chmod(folder_mode)
    if owner is not None:
        os.chown(folder, owner, owner)
        os.chown(script, owner, owner)
    return script


def up(tmp_path: Path, *args: str) -> int:
    return emit.main(
        ["--target", "compose", "--workers", "1", "--gpus", "0", "--out", str(tmp_path / "run"), *args]
    )


def test_script_in_an_owner_only_folder_says_which_chmod(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # What `mktemp -d` makes: 0700, owned by the user running make (not uid 1000).
    script = script_in(tmp_path / "mine", folder_mode=0o700, owner=0 if os.geteuid() == 0 else None)
    assert up(tmp_path, "--script", str(script)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"run: chmod o+rx {script.parent}" in err, err
    assert not (tmp_path / "run").exists(), "nothing may be generated (or started) for an unreadable script"


def test_unreadable_script_file_says_which_chmod(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = script_in(tmp_path / "open", folder_mode=0o755, file_mode=0o600)
    assert up(tmp_path, "--script", str(script)) == 2
    assert f"run: chmod o+r {script}" in capsys.readouterr().err


def test_readable_script_and_data_pass(tmp_path: Path) -> None:
    script = script_in(tmp_path / "open", folder_mode=0o755)
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    assert up(tmp_path, "--script", str(script), "--data", str(data)) == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to uid 1000 needs root")
def test_owner_bits_apply_when_uid_1000_owns_it(tmp_path: Path) -> None:
    script = script_in(tmp_path / "theirs", folder_mode=0o700, file_mode=0o600, owner=mounts.CONTAINER_UID)
    assert mounts.problem("SCRIPT", str(script), is_dir=False) is None


def test_data_folder_without_search_permission(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o750)
    problem = mounts.problem("DATA", str(data), is_dir=True)
    assert problem and problem.endswith(f"chmod o+rx {data}")
