"""Docker Compose on one host: the reference target (`make up`).

Writes, under --out (never edit them; rerun `make up`):
  compose.base.yaml      every service of compose/services.py (Prometheus, Grafana, ...), networks,
                         volumes, secrets; ${BIND_ADDR}, ${RUN_DIR}, ... come from `make up`'s stack.env
  compose.tasks.yaml     one service per task (`chief`, `worker-0`, ...), each with its TF_CONFIG
  compose.gpu.yaml       GPU overlay (device_ids, shm_size, GPU image): only when GPUs are used
  compose.args           the `-f` arguments to pass to `docker compose`, in order
  targets/trainers.json  Prometheus file_sd: one `<service>:<contract.METRICS_PORT>` target per task
Nothing changes meaning here, so the translation report is empty: the supervisor keeps the restart budget.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path

from compose import deployment, gpus, knobs, mounts, services
from compose.deployment import SHM_GIB, Deployment
from compose.engine import Engine, Stack
from compose.services import Healthcheck, Service
from compose.targets import Emitted, Place, Yaml
from compose.yamltext import Interpolated

TITLE = "compose"
REMAKE = "make up"
OUT = ".run"
BIND_ADDR = "127.0.0.1"
"""Where the UIs are published unless `make up BIND_ADDR=` says otherwise."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", default="auto", help="auto, 0 (CPU), a count, or indices like 0,2,3")
    p.add_argument("--gpus-per-worker", type=int, default=1)


def describe(
    ns: argparse.Namespace, environ: Mapping[str, str], runner: gpus.Runner = gpus.run
) -> Deployment:
    """GPUs detected (or given) and handed out per task; SCRIPT and DATA checked readable by the
    containers' user before anything starts."""
    ids = gpus.parse(ns.gpus, runner)
    tasks = [t.name for t in Deployment(workers=ns.workers).tasks]
    assigned = gpus.assign(tasks, ids, ns.gpus_per_worker) if ids else None
    d = deployment.from_args(ns, assigned, environ=environ)
    for variable, path, is_dir in (("SCRIPT", d.script, False), ("DATA", d.data, True)):
        if path and (problem := mounts.problem(variable, path, is_dir=is_dir)):
            raise ValueError(problem)
    if d.output and (problem := mounts.problem("OUTPUT", d.output, is_dir=True, want="rwx")):
        raise ValueError(problem)
    return d


def emit(d: Deployment, ns: argparse.Namespace) -> Emitted:
    out = Path(ns.out)
    files: dict[str, Yaml | str] = {
        "compose.base.yaml": Yaml((base_file(d),)),
        "compose.tasks.yaml": Yaml((tasks_file(d),)),
    }
    if d.gpu_ids:
        files["compose.gpu.yaml"] = Yaml((gpu_overlay(d),))
    compose_files = [out / name for name in files]
    files["compose.args"] = " ".join(f"-f {f}" for f in compose_files) + "\n"
    files.update(services.run_files(d))
    devices = ", ".join(f"{t}: GPU {','.join(i)}" for t, i in (d.gpu_ids or {}).items())
    return Emitted(
        files=files,
        summary=f"chief + {d.workers} workers, {devices or 'CPU only'}",
        notes=() if d.script else (knobs.describe(d.knobs),),
        remove=() if d.gpu_ids else ("compose.gpu.yaml",),
        extra={"compose_files": compose_files},
    )


def tasks_file(d: Deployment) -> dict:
    trainers = services.trainers(d)
    return {"services": {s.name: service(s, trainers, d.base_image) for s in trainers}}


def base_file(d: Deployment) -> dict:
    beside = tuple(services.for_deployment(s, d.image()) for s in services.SERVICES)
    every = beside + services.trainers(d)
    return {
        "name": services.PROJECT,
        "services": {s.name: service(s, every, d.base_image) for s in beside},
        "networks": services.NETWORKS,
        "volumes": {name: {} for name in services.volumes(services.trainers(d) + services.SERVICES)},
        "secrets": {
            name: {"file": Interpolated(f"${{SECRETS_DIR:-./secrets}}/{name}")}
            for name in services.secrets(services.SERVICES)
        },
    }


def service(s: Service, every: tuple[Service, ...], base_image: str) -> dict:
    """One service as Compose writes it; `every`: the deployment's services (who builds which image)."""
    built = s.build or s.trainer_image or any(o.build and o.image == s.image for o in every)
    # An image this deployment builds is what it is; any other can be replaced (`make up` sets them).
    variable = Interpolated(f"${{{services.image_variable(s)}:-{s.image}}}")
    out: dict = {"image": s.image if built else variable}
    if s.build:
        out["build"] = {**services.TRAINER_BUILD, "args": {"BASE_IMAGE": base_image, "VARIANT": "cpu"}}
    else:
        out["pull_policy"] = "never" if built else "missing"
    if s.optional:
        out["profiles"] = [s.name]  # `make up` enables it when the image is present or pullable
    _put(out, "command", list(s.command))
    _put(out, "environment", dict(s.environment))
    _put(out, "expose", [str(p) for p in s.expose])
    _put(out, "ports", [Interpolated(f"${{BIND_ADDR:-{BIND_ADDR}}}:{p}:{p}") for p in s.publish])
    out["networks"] = list(s.networks)
    if s.fast_dns:
        out["dns_opt"] = ["timeout:1", "attempts:1"]
    if s.init:
        out["init"] = True  # tini as PID 1 forwards SIGTERM: `docker stop` takes 0.2 s instead of 10
    out["restart"] = s.restart
    if s.stop_grace_s is not None:
        out["stop_grace_period"] = f"{s.stop_grace_s}s"
    out.update(user=s.user, read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges:true"])
    out["logging"] = services.LOGGING
    _put(out, "secrets", list(s.secrets))
    _put(out, "tmpfs", [_owned(t, s.user) for t in s.tmpfs])
    _put(out, "volumes", _volumes(s))
    if s.healthcheck:
        out["healthcheck"] = healthcheck(s.healthcheck)
    _put(out, "depends_on", {n: {"condition": _condition(n, every)} for n in s.depends_on})
    return out


def _owned(target: str, user: str | None) -> str:
    """A tmpfs the service's user writes (a non-chief's checkpoint copy): Docker mounts a tmpfs owned
    by root whatever owns the image's directory, so it gets the user as owner. /tmp keeps the image's
    1777, which Docker copies."""
    if target == "/tmp" or not user:
        return target
    uid, _, gid = user.partition(":")
    return f"{target}:uid={uid},gid={gid or uid}"


def healthcheck(h: Healthcheck) -> dict:
    """A healthcheck as Compose files and Swarm stacks both write it."""
    return {
        "test": ["CMD", *h.test],
        "interval": f"{h.interval_s}s",
        "timeout": f"{h.timeout_s}s",
        "retries": h.retries,
    }


def _put(out: dict, key: str, value: list | dict) -> None:
    if value:
        out[key] = value


def _condition(name: str, every: tuple[Service, ...]) -> str:
    dep = next((o for o in every if o.name == name), None)
    if dep is None:
        raise ValueError(f"compose/services.py: depends_on names {name!r}, which is no service")
    return "service_healthy" if dep.healthcheck else "service_started"


def _volumes(s: Service) -> list:
    return [
        *(f"./{c.source}:{c.target}:ro" for c in s.configs),
        *(Interpolated(f"${{RUN_DIR:-./.run}}/{r.name}:{r.target}:ro") for r in s.run_dirs),
        *(f"{name}:{target}" for name, target in s.volumes),
        # create_host_path false: a mistyped path fails `up` instead of silently mounting an empty dir.
        *(
            {
                "type": "bind",
                "source": b.source,
                "target": b.target,
                **({"read_only": True} if b.read_only else {}),
                "bind": {"create_host_path": False},
            }
            for b in s.binds
        ),
    ]


def gpu_overlay(d: Deployment) -> dict:
    services_: dict = {}
    for task, ids in (d.gpu_ids or {}).items():
        service_: dict = {"image": d.image("gpu")}
        if task == "chief":
            service_["build"] = {"args": {"VARIANT": "gpu"}}
        # NCCL's shared-memory transport fails with Docker's 64 MB /dev/shm (NVIDIA/nccl#342).
        service_["shm_size"] = f"{SHM_GIB}gb"
        service_["deploy"] = {
            "resources": {
                "reservations": {
                    "devices": [{"driver": "nvidia", "device_ids": list(ids), "capabilities": ["gpu"]}]
                }
            }
        }
        services_[task] = service_
    return {"services": services_}


def deploy(place: Place, engine: Engine, services: Sequence[str] = ()) -> None:
    """Start the stack (images built already: compose/up.py builds once, on the chief)."""
    engine.compose(
        Stack(place.project, place.out),
        "up",
        "-d",
        "--no-build",
        "--remove-orphans",
        "--quiet-pull",
        *services,
    )


def undeploy(place: Place, engine: Engine, volumes: bool = False) -> None:
    """Stop and remove the containers (and the volumes: checkpoints, Prometheus history). Without the
    files a `make up` generated, Compose finds the project's containers by its label alone."""
    engine.compose(
        Stack(place.project, place.out), "down", *(["--volumes"] if volumes else []), "--remove-orphans"
    )
