"""Docker Swarm across hosts (`make stack-up`): a stack bundle, and what changed on the way.

Writes a self-contained bundle under --out (copy it to any manager and `docker stack deploy -c
stack.yaml NAME`; never edit it, rerun the command):
  stack.yaml        version "3.9": one service per task, then every service of compose/services.py
                    (an optional one, such as Grafana, only with --<name>-image)
  configs/...       every config folder's files and the run files as swarm configs (no bind mounts
                    across hosts); names carry a content hash because configs are immutable
  translation.txt   the translation report, also printed
The trainer services are the Compose target's own, translated key by key, so the two cannot drift
apart silently: a Compose key this module has no translation for fails it. The other services are
translated from their one description.
"""

from __future__ import annotations

import argparse
import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from compose import deployment, services, swarmstate
from compose.deployment import CHECKPOINT_DIR, SHM_GIB, Change, Deployment
from compose.engine import Engine
from compose.services import Service
from compose.targets import Emitted, Place, Yaml
from compose.targets import compose as compose_target
from trainer.host import CHIEF

TITLE = "swarm stack"
REMAKE = "make stack-up"
OUT = ".run/swarm"
REPO = Path(__file__).resolve().parents[2]
NODE_LABEL = "org.mwms.node"
"""The node label every placement constraint uses; `compose/swarm/nodes.sh` sets node-1, node-2, ..."""
SHM_SIZE_BYTES = SHM_GIB * 1024**3
RESTART_DELAY = "5s"
RESTART_WINDOW = "10m"
"""Swarm counts a task's restarts (its container replaced: its node lost, or a final exit) within this
window against max_attempts (the restart budget), so the budget renews with time; inside a container
the supervisor's budget renews with every checkpoint. A final exit is re-run at most max_attempts
times, quickly (the supervisor's state on that node exits at once), then stays down."""
CHECKPOINTS = "checkpoints"
"""The checkpoint volume's name (compose/services.py): on Swarm every task mounts it on its node."""
IMAGES = {
    "prometheus": "mwms/prometheus:2.42.0-bookworm",
    "alertmanager": "mwms/alertmanager:0.25.0-bookworm",
}
"""Swarm's default image of a service where it differs from the description's: nodes cannot pull from
outside, so Prometheus is the Debian-built image that `make stack-up` loads or pushes."""
ALERTMANAGER_CONFIG = Path(services.ALERTMANAGER.configs[0].source) / "alertmanager.yml"
"""The file users edit for receivers and routes (`make check-alerts` validates it): Compose mounts it,
Swarm ships it as a config; --alertmanager-config ships another file in its place."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=3, help="nodes labelled org.mwms.node=node-1..N")
    for s in services.SERVICES:
        default = None if s.optional or s.trainer_image else IMAGES.get(s.name, s.image)
        what = "; none: no such service (the report says what to do instead)" if s.optional else ""
        what = "; default: the trainers' image (--image)" if s.trainer_image else what
        p.add_argument(
            f"--{s.name}-image", default=default, help=f"{s.title} image as the nodes pull it{what}"
        )
    p.add_argument(
        "--gpus-per-worker", type=int, default=0, help="GPUs per task (0: CPU); the node picks them"
    )
    p.add_argument("--secrets-dir", type=Path, default=Path("secrets"))
    p.add_argument(
        "--alertmanager-config",
        type=Path,
        default=REPO / ALERTMANAGER_CONFIG,
        help="the Alertmanager config (receivers, routes) shipped as the alertmanager config; default: "
        "the one file Compose mounts too",
    )
    p.add_argument(
        "--trainer-nodes",
        type=node_list,
        default=(),
        help="one task per node: the chief on the first node labelled org.mwms.node=<name>, worker-0 on "
        "the second, ... (comma-separated; empty: the scheduler places every task)",
    )
    p.add_argument(
        "--encrypt-overlay",
        action="store_true",
        help="IPsec-encrypt the overlay networks (needs ESP in every node's kernel: docs/security.md)",
    )


def describe(ns: argparse.Namespace, environ: Mapping[str, str]) -> Deployment:
    if ns.nodes < 1:
        raise ValueError(f"NODES={ns.nodes}: a swarm needs at least one node")
    if ns.trainer_nodes and len(ns.trainer_nodes) < ns.workers + 1:
        raise ValueError(
            f"TRAINER_NODES={','.join(ns.trainer_nodes)}: {len(ns.trainer_nodes)} nodes for a chief + "
            f"{ns.workers} workers, one task per node: name {ns.workers + 1} or more, or WORKERS="
            f"{len(ns.trainer_nodes) - 1}"
        )
    return deployment.from_args(ns, deployment.fake_gpu_ids(ns.workers, ns.gpus_per_worker), environ=environ)


class Report:
    """The changes met while translating, each once, in the order met."""

    def __init__(self) -> None:
        self.changes: list[Change] = []

    def add(self, change: Change) -> None:
        if change not in self.changes:
            self.changes.append(change)


def emit(d: Deployment, ns: argparse.Namespace) -> Emitted:
    report = Report()
    chosen = [(s, image) for s in services.SERVICES if (image := _image(s, ns, d)) or not s.optional]
    stack = trainer_services(d, ns.nodes, report)
    _pin(stack, ns.trainer_nodes, report)
    sources = {}
    replaced = {ALERTMANAGER_CONFIG: ns.alertmanager_config.read_text()}
    for s, image in chosen:
        stack[s.name], files = _service(s, image, ns.nodes, d, report, replaced)
        if clash := set(files) & set(sources):
            raise ValueError(
                f"swarm: {s.name}'s config files {sorted(clash)} clash with another service's: rename one"
            )
        sources.update(files)
    for s in services.SERVICES:
        if s not in [c for c, _ in chosen]:
            report.add(Change(s.title, "", f"no {s.title} image ({_flag(s).upper()}=): {s.elsewhere}"))
    doc: dict = {
        "version": "3.9",
        "services": stack,
        "networks": {name: overlay(net, ns.encrypt_overlay) for name, net in services.NETWORKS.items()},
        "volumes": {
            name: {} for name in services.volumes(services.trainers(d) + tuple(s for s, _ in chosen))
        },
        "configs": {
            key: {"file": f"./configs/{key}", "name": f"{key}_{_digest(text)}"}
            for key, text in sorted(sources.items())
        },
    }
    if names := services.secrets(tuple(s for s, _ in chosen)):
        doc["secrets"] = {name: _secret(name, ns.secrets_dir / name) for name in names}
    files: dict[str, Yaml | str] = {"stack.yaml": Yaml((doc,))}
    files.update({f"configs/{key}": text for key, text in sorted(sources.items())})
    if not ns.encrypt_overlay:
        report.add(ENCRYPTION)
    files["translation.txt"] = deployment.report(TITLE, report.changes) + "\n"
    return Emitted(
        files=files,
        changes=report.changes,
        summary=f"chief + {d.workers} workers on {ns.nodes} nodes",
        remove=("configs",),
    )


def _image(s: Service, ns: argparse.Namespace, d: Deployment) -> str | None:
    return getattr(ns, _flag(s)) or (d.pulled_image if s.trainer_image else None)


def overlay(net: dict, encrypted: bool) -> dict:
    return {"driver": "overlay", **net, **({"driver_opts": {"encrypted": ""}} if encrypted else {})}


ENCRYPTION = Change(
    "overlay networks",
    "unencrypted (SWARM_ENCRYPT=1: IPsec)",
    "the trainers' gRPC crosses hosts in clear; encryption needs ESP in every node's kernel, and without "
    "it swarm drops every packet silently (docs/security.md)",
)


def _flag(s: Service) -> str:
    """The argparse destination of --<name>-image."""
    return services.image_variable(s).lower()


def placement(task_position: int, nodes: int) -> dict:
    """Pin a monitoring service to one node by label: its volume (Prometheus's history) is per node."""
    return {"constraints": [f"node.labels.{NODE_LABEL} == node-{task_position % nodes + 1}"]}


def node_list(text: str) -> tuple[str, ...]:
    """TRAINER_NODES as given: node names (their org.mwms.node label), each once."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if len(set(names)) != len(names) or any(not re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names):
        raise argparse.ArgumentTypeError(f"TRAINER_NODES={text!r}: distinct node names, comma-separated")
    return names


def _pin(stack: dict, nodes: tuple[str, ...], report: Report) -> None:
    """One task per node, in the order given: a task whose node is lost waits Pending (no other node may
    take it), which is what `make stack-elastic` watches to run on with fewer workers."""
    if not nodes:
        return
    for name, node in zip(stack, nodes, strict=False):
        stack[name]["deploy"]["placement"] = {"constraints": [f"node.labels.{NODE_LABEL} == {node}"]}
    report.add(
        Change(
            "one container per task",
            f"one task per node, pinned in TRAINER_NODES order ({','.join(nodes)})",
            "a task whose node is lost stays Pending: make stack-elastic goes on with fewer workers "
            "after RESIZE_AFTER and grows back when the node is ready again",
        )
    )


def gpu_resources(count: int) -> dict:
    """`deploy.resources` asking for `count` GPUs as swarm generic resources (the node advertises them)."""
    return {
        "reservations": {"generic_resources": [{"discrete_resource_spec": {"kind": "GPU", "value": count}}]}
    }


def tmpfs_volume(target: str, size: int | None = None) -> dict:
    volume: dict = {"type": "tmpfs", "target": target}
    if size:
        volume["tmpfs"] = {"size": size}
    return volume


def trainer_services(d: Deployment, nodes: int, report: Report) -> dict:
    tasks = compose_target.tasks_file(d)["services"]
    overlay = compose_target.gpu_overlay(d)["services"]
    return {
        name: _translate(name, pos, {**service, **overlay.get(name, {})}, d, nodes, report)
        for pos, (name, service) in enumerate(tasks.items())
    }


def _translate(name: str, position: int, compose: dict, d: Deployment, nodes: int, report: Report) -> dict:
    # A stable hostname per task and run: the supervisor keys its state (a final exit, the budget) by
    # hostname, so a replacement container on the same node goes on from it; a new run starts afresh.
    service: dict = {"image": d.pulled_image, "hostname": f"{name}-{d.run}"}
    # Not pinned: every task keeps its own checkpoint copy, so any node can run any task.
    deploy: dict = {"replicas": 1, "endpoint_mode": "dnsrr"}
    volumes: list = []
    for key, value in compose.items():
        if key in KEPT:
            service[key] = value
        elif key in TRANSLATIONS:
            TRANSLATIONS[key](value, service, deploy, volumes)
        else:
            raise ValueError(f"swarm: no Swarm translation for the Compose key {key!r} of {name}")
        if key in CHANGES:
            report.add(Change(key, *CHANGES[key]))
    report.add(
        Change(
            "one container per task",
            "one service per task, replicas 1, endpoint_mode dnsrr, not pinned to a node",
            "a VIP needs IPVS and its idle timeout drops long gRPC connections (moby/moby#37466); "
            "any node can run any task: no node holds the only checkpoint",
        )
    )
    if name == CHIEF:
        report.add(
            Change(
                f"volume {CHECKPOINTS}",
                f"node-local, mounted by every task at {CHECKPOINT_DIR} (each its own sub-folder)",
                "replicas are identical: the tasks restore from the newest copy any of them still has, "
                "so losing a node costs at most one save interval",
            )
        )
    volumes = _own_checkpoint_copy(volumes)
    if volumes:
        service["volumes"] = volumes
    # Bounded whatever Compose said: a permanent failure must not restart forever.
    deploy.setdefault("restart_policy", {"condition": "on-failure", "delay": RESTART_DELAY})
    deploy["restart_policy"].setdefault("max_attempts", d.max_restarts)
    deploy["restart_policy"].setdefault("window", RESTART_WINDOW)
    service["deploy"] = deploy
    return service


def _own_checkpoint_copy(volumes: list) -> list:
    """The node's checkpoint volume instead of Compose's per-container tmpfs: a task's copy outlives
    its container, for whichever task runs on that node next."""
    kept = [v for v in volumes if not (isinstance(v, dict) and v.get("target") == CHECKPOINT_DIR)]
    mount = f"{CHECKPOINTS}:{CHECKPOINT_DIR}"
    return kept if mount in kept else [*kept, mount]


def _restart(value: str, service: dict, deploy: dict, volumes: list) -> None:
    deploy["restart_policy"] = {"condition": _condition(value), "delay": RESTART_DELAY}


def _condition(restart: str) -> str:
    # "no" (a supervisor inside the container restarts the trainer by exit code) still needs swarm
    # to restart on failure: a task lost with its node comes back only through the orchestrator.
    return {"no": "on-failure", "unless-stopped": "any", "always": "any"}.get(restart, restart)


def _tmpfs(value: list[str], service: dict, deploy: dict, volumes: list) -> None:
    # Compose's "path:uid=..,gid=.." options have no long-syntax equivalent; the one tmpfs they are
    # for (a non-chief's checkpoints) becomes the node's volume (_own_checkpoint_copy).
    volumes.extend(tmpfs_volume(target.split(":", 1)[0]) for target in value)


def _volumes(value: list, service: dict, deploy: dict, volumes: list) -> None:
    volumes.extend(value)


def _shm(value: str, service: dict, deploy: dict, volumes: list) -> None:
    volumes.append(tmpfs_volume("/dev/shm", SHM_SIZE_BYTES))


def _devices(value: dict, service: dict, deploy: dict, volumes: list) -> None:
    devices = value["resources"]["reservations"]["devices"]
    deploy["resources"] = gpu_resources(sum(len(d["device_ids"]) for d in devices))


def _drop(value: object, service: dict, deploy: dict, volumes: list) -> None:
    return None


KEPT = {
    "command",
    "environment",
    "init",
    "user",
    "read_only",
    "cap_drop",
    "stop_grace_period",
    "networks",
    "logging",
}
TRANSLATIONS = {
    "restart": _restart,
    "tmpfs": _tmpfs,
    "volumes": _volumes,
    "shm_size": _shm,
    "deploy": _devices,
    "build": _drop,
    "pull_policy": _drop,
    "expose": _drop,
    "dns_opt": _drop,
    "security_opt": _drop,
    "image": _drop,
}
CHANGES = {
    "image": ("the pushed image by digest", "every node runs the same bytes"),
    "build": ("", "stacks never build: `make push` puts the image in a registry"),
    "pull_policy": ("", "nodes pull the pinned digest"),
    "expose": ("", "an overlay network reaches every port of a task"),
    "dns_opt": (
        "",
        "not in the stack schema (an error); an outside name (TensorFlow's GCE metadata probe) "
        "can take the resolver's full timeout",
    ),
    "restart": (
        f"deploy.restart_policy (condition, max_attempts within window {RESTART_WINDOW}, delay {RESTART_DELAY})",
        "stacks ignore `restart`",
    ),
    "tmpfs": ("long-syntax tmpfs volumes", "a stack silently drops service-level `tmpfs`"),
    "shm_size": (f"tmpfs volume at /dev/shm ({SHM_GIB} GiB)", "stacks drop shm_size (moby/moby#26714)"),
    "deploy": (
        "generic_resources kind GPU",
        "GPU devices are a schema error in stacks (docker/cli#3051); "
        "the node advertises its GPUs (README: GPU nodes)",
    ),
    "security_opt": (
        "",
        "stacks ignore it (no no-new-privileges); the image has no setuid/setgid binaries "
        "and every capability is dropped, so nothing can gain privileges",
    ),
}


def _service(
    s: Service, image: str, nodes: int, d: Deployment, report: Report, replaced: Mapping[Path, str]
) -> tuple[dict, dict[str, str]]:
    """A service of compose/services.py as a stack service, and the config files it ships (key -> text;
    `replaced`: a source file's text given in its place)."""
    configs = _configs(s, d, replaced)
    out: dict = {"image": image, "user": s.user, "read_only": True, "cap_drop": ["ALL"]}
    out["logging"] = services.LOGGING
    if s.command:
        out["command"] = list(s.command)
    if s.environment:
        out["environment"] = dict(s.environment)
    if s.secrets:
        out["secrets"] = [{"source": name, "target": name} for name in s.secrets]
    if configs:
        out["configs"] = [{"source": key, "target": target} for key, (target, _) in configs.items()]
    out["volumes"] = [
        *(f"{name}:{target}" for name, target in s.volumes),
        *(tmpfs_volume(t) for t in s.tmpfs),
    ]
    out["networks"] = list(s.networks)
    if s.publish:
        out["ports"] = [{"target": p, "published": p, "protocol": "tcp", "mode": "host"} for p in s.publish]
    if s.healthcheck:
        out["healthcheck"] = compose_target.healthcheck(s.healthcheck)
    out["deploy"] = {
        "replicas": 1,
        # No IPVS on these kernels: a VIP answers "No route to host" (docs/multi-host.md).
        "endpoint_mode": "dnsrr",
        "placement": placement(0, nodes),
        "restart_policy": {"condition": _condition(s.restart), "delay": RESTART_DELAY},
    }
    _report(s, report)
    return out, {key: text for key, (_, text) in configs.items()}


def _report(s: Service, report: Report) -> None:
    if s.configs or s.run_dirs:
        report.add(
            Change(
                f"{s.title} bind mounts",
                "swarm configs named <key>_<content hash>",
                "bind mounts do not cross hosts; configs are immutable, so new content gets a new name",
            )
        )
    for port in s.publish:
        report.add(
            Change(
                f"ports BIND_ADDR:{port}",
                "mode host on node-1, every address of the node",
                "the ingress mesh needs IPVS; the long syntax has no host IP: firewall the node",
            )
        )
    if s.trainer_image:
        report.add(
            Change(
                f"volume {s.volumes[0][0]}" if s.volumes else s.title,
                f"node-local: {s.title} on node-1 reads what the tasks that ran on node-1 wrote",
                "volumes are per node; `make profile` is Compose-only (each task writes its own trace)",
            )
        )
    for name in s.secrets:
        report.add(
            Change(
                f"{s.title} secret",
                f"secret {name}_<content hash>",
                "secrets are immutable: new content is a new name",
            )
        )
    if s.depends_on:
        report.add(
            Change(
                "depends_on",
                "",
                f"stacks ignore it: {s.title} retries {', '.join(s.depends_on)} until it answers",
            )
        )
    for key in ("pull_policy", "security_opt", "restart"):
        report.add(Change(key, *CHANGES[key]))


def _configs(s: Service, d: Deployment, replaced: Mapping[Path, str]) -> dict[str, tuple[str, str]]:
    """Config key -> (path in the container, content) for every file of the service's config folders
    and run folders. Keys are the file's path (folder separators and dots as `_`, suffix dropped)."""
    found: dict[str, tuple[str, str]] = {}
    for c in s.configs:
        for rel in services.config_files(c, REPO):
            source = Path(c.source) / rel
            text = replaced[source] if source in replaced else (REPO / source).read_text()
            _add(found, _key(rel), f"{c.target}/{rel.as_posix()}", text)
    run = services.run_files(d)
    for r in s.run_dirs:
        for path, text in run.items():
            rel = Path(path)
            if rel.parts[0] == r.name:
                _add(found, _key(rel), f"{r.target}/{rel.relative_to(r.name).as_posix()}", text)
    return found


def _key(rel: Path) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", rel.with_suffix("").as_posix())


def _add(found: dict, key: str, target: str, text: str) -> None:
    if key in found:
        raise ValueError(f"swarm: two config files map to the key {key!r}: rename one")
    found[key] = (target, text)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _secret(name: str, path: Path) -> dict:
    # Secrets are immutable: a new password is a new name, and the deploy swaps the service over to it.
    return {"file": str(path.resolve()), "name": f"{name}_{_digest(path.read_text())}"}


def deploy(place: Place, engine: Engine, services: Sequence[str] = ()) -> None:
    """The bundle onto a manager node, then `docker stack deploy --prune` there (the host is no swarm
    member; --prune drops the workers no longer in it; the images are on the nodes already)."""
    m = swarmstate.Manager(place.swarm, place.nodes, engine=engine)
    box, here = m.container(), f"/stacks/{place.project}"
    engine.docker("exec", box, "rm", "-rf", here, timeout=60)
    engine.docker("exec", box, "mkdir", "-p", "/stacks", timeout=60)
    engine.docker("cp", str(place.out), f"{box}:{here}", timeout=300)
    # From the bundle's folder: its configs are named relative to stack.yaml.
    engine.docker("exec", "-w", here, box, "docker", "stack", "deploy", "--prune", "--resolve-image", "never",
                  "-c", "stack.yaml", place.project, timeout=300)  # fmt: skip


def undeploy(place: Place, engine: Engine, volumes: bool = False) -> None:
    """`docker stack rm` on a manager. Each node keeps its checkpoint volume (every task's copy): a
    redeploy resumes; `volumes` is not honoured here (they live on the nodes, make nodes-down removes them)."""
    m = swarmstate.Manager(place.swarm, place.nodes, engine=engine)
    m.docker("stack", "rm", place.project)
