"""`make engine` (compose/engine.sh) installs what the tests need: here the docker CLI that has
`docker stack config`, which Debian bookworm's docker.io (CLI 20.10) lacks. The tests find it by asking
engine.sh (`engine.sh docker-cli`), so the two cannot name different binaries."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import conftest
from tests.unit.test_compose_stack import bundle

ENGINE = str(conftest.ROOT / "compose" / "engine.sh")


def without_usr_local_bin() -> str:
    """PATH as on a host whose only docker CLI is Debian's: the machine image's /usr/local/bin/docker
    (CLI 28) must not be what makes the tests pass."""
    return ":".join(p for p in os.environ["PATH"].split(":") if not p.startswith("/usr/local/"))


def test_make_engine_installs_the_stack_cli_the_tests_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make engine` on a host where the engine runs: installs the pinned CLI once, says so in one line,
    and a second run says nothing new; `docker stack config` from it checks our generated stack file."""
    if os.geteuid() != 0 or not Path("/etc/debian_version").exists():
        pytest.skip("make engine installs only as root on Debian/Ubuntu")
    conftest.need("docker engine")
    cli_dir = tmp_path / "docker-cli"
    env = {**os.environ, "PATH": without_usr_local_bin(), "DOCKER_CLI_DIR": str(cli_dir)}

    def make_engine() -> list[str]:
        done = subprocess.run([ENGINE, "install"], env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        return done.stderr.splitlines()

    first, again = make_engine(), make_engine()
    assert first[0].startswith("engine: installing docker CLI ") and f"into {cli_dir}" in first[0]
    assert len(first) == 2 and first[1].startswith("engine: ready:")
    assert again == first[1:]

    monkeypatch.setenv("DOCKER_CLI_DIR", str(cli_dir))
    asked = conftest.docker_cli()
    assert asked.returncode == 0, asked.stderr
    cli = asked.stdout.strip()
    assert cli == str(cli_dir / "usr/bin/docker")

    bundle(tmp_path / "bundle")
    checked = subprocess.run(
        [cli, "stack", "config", "-c", "stack.yaml"],
        cwd=tmp_path / "bundle",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    # It does check: a key Swarm does not know is refused.
    (tmp_path / "bad.yaml").write_text("services:\n  a:\n    image: x\n    deploy:\n      bogus: 1\n")
    refused = subprocess.run(
        [cli, "stack", "config", "-c", str(tmp_path / "bad.yaml")], capture_output=True, text=True
    )
    assert refused.returncode != 0 and "bogus" in refused.stderr


def test_a_missing_stack_cli_is_one_line_naming_make_engine(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_CLI_DIR": str(tmp_path / "none")}
    done = subprocess.run([ENGINE, "docker-cli"], env=env, capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == f"{tmp_path}/none/usr/bin/docker is missing: `make engine` installs it\n"


def test_debians_own_cli_is_not_taken_for_the_pinned_one(tmp_path: Path) -> None:
    """Debian bookworm's docker CLI (20.10) where the pinned one should be: refused, naming both versions."""
    debian = Path("/usr/bin/docker")
    if not debian.exists():
        pytest.skip("no /usr/bin/docker (Debian's docker.io) here")
    (tmp_path / "usr/bin").mkdir(parents=True)
    shutil.copy2(debian, tmp_path / "usr/bin/docker")
    env = {**os.environ, "DOCKER_CLI_DIR": str(tmp_path)}
    done = subprocess.run([ENGINE, "docker-cli"], env=env, capture_output=True, text=True)
    version = subprocess.run([debian, "--version"], capture_output=True, text=True).stdout.strip()
    assert done.returncode == 1, done.stdout
    assert done.stderr.startswith(
        f"{tmp_path}/usr/bin/docker says '{version}', not 26.1.5: `make engine` installs it"
    )
