"""`make up`'s steps, in order, from one parsed Settings (compose/lifecycle.py holds the lock).

0. refusals, one line each, before any download, build or container (compose/preflight.py, every knob)
1. the engine (compose/engine.sh ensure); 2. base images, pulled or built from Debian packages
3. the Compose files (compose/emit.py); 4. wheels on the host; 5. optional services (Grafana)
6. stack.env; 7. the trainer image, built once; 8. the checkpoint check; 9. start; 10. the URLs
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import contract
from compose import deployment, emit, gpus, preflight, services, settings
from compose.engine import ROOT, Engine, EngineError, Stack
from compose.settings import Settings
from compose.targets import Place
from compose.targets import compose as compose_target

IMAGES_SH = str(ROOT / "images" / "images.sh")
ENGINE_SH = str(ROOT / "compose" / "engine.sh")
BUILD_PROJECT = "mwms-image"
"""The trainer image is built under one project name whatever the stack's: Compose writes the project
into the image's labels, so two projects' builds of the same code were two image ids under one tag.
Each build moved the tag and pruned the other's image, and make stack-up's push could not untag what a
running container used ("unable to remove repository reference ... must force")."""
BUILD_LOCK = Path(tempfile.gettempdir()) / "mwms-build.lock"
"""One build at a time on this engine: two make ups side by side would restage the build context the
other is still reading."""
NOTHING_TO_TRAIN = 10
"""trainer.state.manifest's exit when the checkpoint is at or past STEPS: the monitoring starts alone."""


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def emit_argv(s: Settings, run: str, base_image: str = "") -> list[str]:
    argv = ["--target", "compose", "--workers", str(s.workers), "--out", str(s.run_dir), "--project", s.project,
            "--run", run, "--gpus", s.gpus, "--gpus-per-worker", str(s.gpus_per_worker), "--max-restarts",
            str(s.max_restarts), "--image-repo", s.image_repo, "--args", s.args]  # fmt: skip
    argv += ["--script", s.script] if s.script else []
    argv += ["--data", s.data] if s.data else []
    argv += ["--output", s.output] if s.output else []
    return argv + (["--base-image", base_image] if base_image else [])


def check(s: Settings, eng: Engine, environ: Mapping[str, str], quiet: bool = False, starting: bool = True):
    """Step 0: the refusals (ValueError, one line), and the Compose target's description of the job.
    Returns (environment with the tune's winner, emit.Run)."""
    ns = argparse.Namespace(project=s.project, bind_addr=s.bind_addr, workers=str(s.workers),
                            gpus=s.gpus if starting else "0", starting=starting)  # fmt: skip
    if found := preflight.problems(
        ns, runner=lambda cmd: eng.query(*cmd[1:]) if cmd[0] == "docker" else gpus.run(cmd)
    ):
        raise ValueError("\n".join([found[0], *(f"up: {p}" for p in found[1:])]))
    env = dict(environ)
    if s.output:
        output_folder(s.output)  # the emitter checks it exists (make images too: the same files)
    if starting:
        env, used = settings.with_tuned(env, settings.read_tuned(s.run_dir / settings.TUNED))
        if used and not quiet:
            say(f"up: using make tune's winner from {s.run_dir / settings.TUNED}: {' '.join(used)} "
                f"(undo: rm {s.run_dir / settings.TUNED}, or give the setting on the command line)")  # fmt: skip
    try:
        return env, emit.run(emit_argv(s, deployment.run_id()), env)
    except argparse.ArgumentError as err:
        raise ValueError(err.message) from None


def up(s: Settings, eng: Engine, environ: Mapping[str, str], build_only: bool = False) -> int:
    s.run_dir.mkdir(parents=True, exist_ok=True)
    env, described = check(s, eng, environ, starting=not build_only)
    run_id = described.deployment.run
    subprocess.run([ENGINE_SH, "ensure"], check=True)
    images = base_images(s)
    r = emit.run(emit_argv(s, run_id, images["BASE_IMAGE"]), env)
    emit.write(r)
    emit.print_report(r)
    if not build_only:
        settings.record(environ, s.run_dir / settings.RECORD)
    variant = r.deployment.variant
    subprocess.run([IMAGES_SH, "fetch", f"images/requirements-{variant}.lock", f"build/wheelhouse-{variant}"],
                   check=True, cwd=ROOT)  # fmt: skip
    profiles = optional_services(s, environ)
    write_stack_env(s, run_id, images, profiles, environ)
    build(s, eng, variant)
    if build_only:
        return 0
    start(s, eng, r)
    print_urls(s, profiles, environ)
    return 0


def base_images(s: Settings) -> dict[str, str]:
    """Step 2: the base, Prometheus and Alertmanager images, pulled when a registry answers, else built
    from Debian packages side by side (they mostly wait on the mirrors: ~92 s cold against 62 + 53 + ~75 s
    one after another), each one's line printed whole when it ends."""
    out = subprocess.run([IMAGES_SH, "select", s.offline], check=True, capture_output=True, text=True).stdout
    images = dict(line.split("=", 1) for line in out.split() if "=" in line)
    if not images["BASE_IMAGE"].startswith("mwms/"):
        return images
    logs = s.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    kinds = ("base", "prometheus", "alertmanager")
    said = {k: open(logs / f"{k}-image.said", "w+") for k in kinds}  # noqa: SIM115 - closed below
    procs = {k: subprocess.Popen([IMAGES_SH, k, images[f"{k.upper()}_IMAGE"]], stderr=said[k]) for k in kinds}
    failed = [k for k, p in procs.items() if p.wait()]
    for k in kinds:
        said[k].seek(0)
        sys.stderr.write(said[k].read())
        said[k].close()
    if failed:
        raise subprocess.CalledProcessError(1, f"images.sh {failed[0]}")
    return images


def optional_services(s: Settings, environ: Mapping[str, str]) -> list[str]:
    """Step 5: each optional service (Grafana) only when its image is here or pullable; Grafana with a
    random admin password (never admin/admin)."""
    found = []
    for svc in (x for x in services.SERVICES if x.optional):
        image = environ.get(services.image_variable(svc)) or svc.image
        if subprocess.run([IMAGES_SH, "pullable", image]).returncode == 0:
            found.append(svc.name)
    if "grafana" in found:
        grafana_password(s.secrets_dir)
    return found


def grafana_password(folder: Path) -> None:
    path = folder / "grafana_admin_password"
    if path.is_file() and path.stat().st_size:
        return
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    # 0644 inside a 0700 directory: readable by Grafana's uid 472 in the container, by no other host user.
    text = "".join(c for c in base64.b64encode(os.urandom(48)).decode() if c.isalnum())[:24]
    path.write_text(text)
    path.chmod(0o644)
    say(f"up: Grafana admin password generated in {path}")


def write_stack_env(
    s: Settings, run_id: str, images: Mapping[str, str], profiles: list[str], environ: Mapping[str, str]
) -> None:
    """Step 6: what every later `docker compose` call (down, logs, status, wait) needs to see the same
    stack. Compose reads it as an --env-file; make reads BIND_ADDR and RUN with $(file <...)."""
    values = {
        "COMPOSE_PROJECT_NAME": s.project,
        "COMPOSE_PROFILES": ",".join(profiles),
        "RUN": run_id,
        "PROMETHEUS_IMAGE": images["PROMETHEUS_IMAGE"],
        "ALERTMANAGER_IMAGE": images["ALERTMANAGER_IMAGE"],
        "PROMETHEUS_RETENTION_TIME": s.retention_time,
        "PROMETHEUS_RETENTION_SIZE": s.retention_size,
        "PROMETHEUS_LIFECYCLE_FLAG": "--web.enable-lifecycle" if s.lifecycle_api else "",
        "BIND_ADDR": s.bind_addr,
        "RUN_DIR": str(s.run_dir.resolve()),
        "SECRETS_DIR": str(s.secrets_dir.resolve()),
        "OUTPUT": str(Path(s.output).resolve()) if s.output else "",
    }
    for svc in (x for x in services.SERVICES if x.optional):
        values[services.image_variable(svc)] = environ.get(services.image_variable(svc)) or svc.image
    text = "".join(f"{k}={v}\n" for k, v in values.items())
    tmp = s.run_dir / ".stack.env.tmp"
    tmp.write_text(text)
    tmp.replace(s.run_dir / "stack.env")


def build(s: Settings, eng: Engine, variant: str) -> None:
    """Step 7: build once, on the chief, with Compose's own builder (the daemon's BuildKit: RUN --mount
    works; Bake needs buildx, which these hosts lack: COMPOSE_BAKE=false), then free our superseded
    images. The builder's copy of the context stays (`make prune` frees it): dropped, every make up sent
    it all again (CPU: 4.8 s against 0.7 s)."""
    with open(BUILD_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run([IMAGES_SH, "stage", f"build/wheelhouse-{variant}"], check=True, cwd=ROOT)
        what = f"up: building {s.image_repo} ({variant}) on the chief service (cold: ~1 min; warm: cached)"
        quietly(s.run_dir / "logs" / "build.log", what,
                lambda log: eng.compose(Stack(BUILD_PROJECT, s.run_dir), "--progress", "plain", "build", "chief",
                                        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "COMPOSE_BAKE": "false"}))  # fmt: skip
        eng.docker("image", "prune", "-f", "--filter", "label=org.mwms.image=trainer")


def quietly(log: Path, what: str, step: Callable[[object], object]) -> None:
    """One line per set-up step, its output in `log` (images/quiet.sh's format); on failure the log's
    last lines and EngineError."""
    log.parent.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    print(f"{what} ... ", end="", file=sys.stderr, flush=True)
    with open(log, "w") as out:
        try:
            step(out)
        except EngineError:
            tail = log.read_text().splitlines()[-30:]
            say(f"FAILED (log: {log}); its last lines:\n" + "\n".join(f"  | {line}" for line in tail))
            raise
    say(f"ok ({time.monotonic() - began:.0f} s; log: {log})")


def replicas(s: Settings, variant: str) -> int:
    return (s.workers + 1) * (s.gpus_per_worker if variant == "gpu" else 1)


def start(s: Settings, eng: Engine, r: emit.Run) -> None:
    """Steps 8-9: does the checkpoint volume fit this job (its settings, a step below STEPS)? A refusal is
    its reason and the ways on (exit 2, trainer/state/manifest.py); at or past STEPS no trainer starts,
    the monitoring does (the finished job's history stays visible); another world size goes on (a resize).
    A SCRIPT= run's checkpoints are its own (TRAINER_CHECKPOINT_DIR): only said."""
    st = Stack(s.project, s.run_dir)
    manifest = [
        "--checkpoint-dir",
        deployment.CHECKPOINT_DIR,
        "--replicas",
        str(replicas(s, r.deployment.variant)),
    ]
    manifest += ["--script"] if s.script else []
    code = eng.result(*eng.compose_args(st), "run", "--rm", "--no-deps", "-T", "chief", "python", "-m",
                      "trainer.state.manifest", *manifest, capture_output=False, timeout=None).returncode  # fmt: skip
    if code == NOTHING_TO_TRAIN:
        monitoring = [x for x in eng.services(st) if not x.startswith(("chief", "worker-"))]
        compose_target.deploy(Place(s.project, s.run_dir), eng, monitoring)
        say("up: no trainer started: nothing to train (above); Prometheus and Grafana show the finished job")
    elif code:
        raise subprocess.CalledProcessError(code, "trainer.state.manifest")
    else:
        compose_target.deploy(Place(s.project, s.run_dir), eng)


def output_folder(output: str) -> Path:
    """OUTPUT: a folder made here is given to the containers' user (uid 1000)."""
    folder = Path(output)
    if not folder.is_dir():
        folder.mkdir(parents=True)
        if os.getuid() == 0:
            os.chown(folder, deployment.UID, deployment.GID)
    return folder


def print_urls(s: Settings, profiles: list[str], environ: Mapping[str, str]) -> None:
    addr, p = s.bind_addr, s.shown
    print(f"""
Prometheus: http://{addr}:{contract.PROMETHEUS_PORT}   (targets: http://{addr}:{contract.PROMETHEUS_PORT}/targets)
Alerts:     http://{addr}:{contract.ALERTMANAGER_PORT}   (Alertmanager; receivers: monitoring/config/alertmanager/alertmanager.yml, docs/alerts.md)
TensorBoard: http://{addr}:{contract.TENSORBOARD_PORT}   (make profile{p} fills its PROFILE tab)""")
    if "grafana" in profiles:
        print(
            f"Grafana:    http://{addr}:{contract.GRAFANA_PORT}   (user admin, password in {s.secrets_dir}/grafana_admin_password)"
        )
    else:
        image = environ.get("GRAFANA_IMAGE") or services.GRAFANA.image
        print(f"""Grafana:    skipped - image {image} is not present and cannot be pulled (offline).
            To see the dashboards, load monitoring/config/grafana/dashboards/*.json into an existing Grafana:
            make publish-dashboards GRAFANA_URL=https://grafana.example GRAFANA_TOKEN=...""")
    print(
        f"Follow:     make status{p} (per-task table) | make logs{p} | make wait{p} (blocks, returns the chief's exit code)"
    )
    print(
        f"Unattended: keep make wait{p} running: it starts again a task killed from outside (docker kill), which Docker leaves down"
    )
    print(f"Stop:       make down{p} (keeps checkpoints and history) | make clean{p} (removes them)")
    if s.output:
        print(f"Model:      {s.output}/model (SavedModel) and {s.output}/summary.json when the job is done")
