"""The trainer image holds the in-container trainer and nothing host-side (bench/, make
fragments): the Dockerfile's own COPY lines built with its own .dockerignore by Compose's builder
(BuildKit reads `<Dockerfile>.dockerignore`), on an empty base so no wheelhouse or base image is needed."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT, engine_ready

DOCKERFILE = ROOT / "images" / "trainer.Dockerfile"


def _probe_dockerfile(tmp: Path) -> Path:
    """The real COPY lines (code from the build context) on `FROM scratch`, beside the real ignore file."""
    copies = [
        line
        for line in DOCKERFILE.read_text().splitlines()
        if line.startswith("COPY ") and "--from" not in line
    ]
    assert copies, f"{DOCKERFILE} copies nothing from the context"
    probe = tmp / "probe.Dockerfile"
    probe.write_text("FROM scratch\n" + "\n".join(copies) + "\n")
    shutil.copy(
        DOCKERFILE.with_name(DOCKERFILE.name + ".dockerignore"), tmp / "probe.Dockerfile.dockerignore"
    )
    return probe


def _files_in(image: str) -> set[str]:
    cid = subprocess.run(
        ["docker", "create", image, "none"], capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        tar = subprocess.run(["docker", "export", cid], capture_output=True, check=True).stdout
    finally:
        subprocess.run(["docker", "rm", cid], capture_output=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return {m.name for m in t.getmembers() if m.isfile()}


def _build(tmp_path: Path) -> set[str]:
    image = f"mwms-layout-probe/{uuid.uuid4().hex[:12]}:probe"
    compose = tmp_path / "compose.yaml"
    compose.write_text(
        f"services:\n  probe:\n    image: {image}\n    build:\n"
        f"      context: {ROOT}\n      dockerfile: {_probe_dockerfile(tmp_path)}\n"
    )
    build = subprocess.run(
        [
            "docker",
            "compose",
            "-p",
            f"mwms-layout-{uuid.uuid4().hex[:8]}",
            "-f",
            str(compose),
            "build",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "COMPOSE_BAKE": "false"},
    )
    assert build.returncode == 0, build.stderr[-2000:]
    try:
        return _files_in(image)
    finally:
        subprocess.run(["docker", "rmi", image], capture_output=True)


def test_image_has_the_trainer_and_no_host_tool(tmp_path):
    engine_ready()
    files = _build(tmp_path)
    code = {f.removeprefix("app/") for f in files if f.startswith("app/")}
    host = sorted(f for f in code if not f.startswith(("trainer/", "contract/")) or f.endswith(".mk"))
    assert not host, f"host-side files in the trainer image: {host}"
    wanted = {str(p.relative_to(ROOT)) for d in ("trainer", "contract") for p in (ROOT / d).rglob("*.py")}
    assert wanted <= code, f"trainer modules missing from the image: {sorted(wanted - code)}"


CONTEXT_SENT = re.compile(r"transferring context: ([\d.]+)([kMG]?B)")
UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def _make_images(run_dir: Path) -> float:
    """A CPU `make images` as a user runs it; the most bytes its build sent the builder in one context."""
    built = subprocess.run(
        ["make", "--no-print-directory", "images", "VARIANT=cpu", "OFFLINE=1", f"RUN_DIR={run_dir}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    sent = CONTEXT_SENT.findall((run_dir / "logs" / "build.log").read_text())
    assert sent, "the build log names no context sent"
    return max(float(n) * UNITS[u] for n, u in sent)


def test_a_warm_build_sends_the_builder_only_what_changed(tmp_path):
    """Every make up builds the image; the wheels in its context (~420 MB) are sent once, not on every
    make up (4.5 CPU-s and 4 s of the build lock each, ~50 make ups in make test). The GPU image's build
    (test_gpu_image, on another lane) replaces the builder's copy with its own: a pair it lands between
    is tried again."""
    engine_ready()
    for _ in range(3):
        _make_images(tmp_path / "run")
        second = _make_images(tmp_path / "run")
        if second < 5e6:
            return
    pytest.fail(f"a warm make images sent the builder {second / 1e6:.0f} MB of context: its copy was dropped")
