"""Every service of a deployment, described once, whatever the target: the trainers, Prometheus, Grafana.

    Deployment (compose/deployment.py) -> trainers(d)   one Service per task (chief, worker-0, ...)
    SERVICES                                           the services beside them, in start order

Each target (compose/targets/) translates a `Service` into its own terms: Compose writes it as is,
Swarm turns config folders into swarm configs and published ports into host-mode ports, Kubernetes
runs the trainers as pods and reports what it does instead of the others (`Service.elsewhere`). A
target never adds a setting of its own to a service: what it cannot express, it reports as a Change.

Adding a service is one entry in SERVICES (docs/architecture.md, "A new service"): an image, a command,
the ports published on BIND_ADDR only, its config folders and data volumes, a healthcheck, depends_on.
Every service runs hardened (read-only root, a /tmp tmpfs, every capability dropped, no new
privileges, a non-root user): there is no field to turn that off. Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import contract
from compose import deployment
from compose.deployment import (
    CHECKPOINT_DIR,
    DATA_DIR,
    GID,
    LOG_DIR,
    OUTPUT_DIR,
    SCRIPT_DIR,
    STOP_GRACE_SECONDS,
    UID,
    Deployment,
)
from compose.yamltext import Interpolated
from trainer.host import supervisor as supervise

CLUSTER, MONITORING = "cluster", "monitoring"
NETWORKS = {CLUSTER: {"internal": True}, MONITORING: {}}
"""Trainers talk gRPC, serve metrics and their profiler on `cluster` only; it is internal (no route
out, nothing published). Prometheus and TensorBoard are on both networks."""
PROJECT = contract.DEFAULT_PROJECT
TRAINER_BUILD = {"context": ".", "dockerfile": "images/trainer.Dockerfile"}
LOGGING = {"driver": "json-file", "options": {"max-size": "10m", "max-file": "3"}}
"""Every container's log, rotated: at most 3 files of 10 MB per container (Docker's json-file default
never rotates, and the logs share the disk with checkpoints and images). `docker logs` still reads it."""
RETENTION_TIME = "15d"
RETENTION_SIZE = "2GB"
"""Prometheus drops the oldest blocks past either limit, whichever comes first (PROMETHEUS_RETENTION_TIME=,
PROMETHEUS_RETENTION_SIZE= at deploy time; docs/security.md)."""
"""How the service with `build` builds the trainer image (the repository is the context)."""


@dataclass(frozen=True)
class ConfigDir:
    """A folder of the repository mounted read-only: Compose binds it; targets without a shared
    file system (Swarm) ship `files` (globs under `source`) one by one."""

    source: str
    """Folder relative to the repository root."""
    target: str
    """Where the service reads it."""
    files: tuple[str, ...] = ("*",)


@dataclass(frozen=True)
class RunDir:
    """A folder of generated files (`run_files`) mounted read-only: written per run under --out."""

    name: str
    """Folder under --out (and under RUN_DIR for `make up`)."""
    target: str


@dataclass(frozen=True)
class Bind:
    """A host path of the user's (SCRIPT=, DATA=, OUTPUT=) mounted, read-only unless written; it must exist."""

    source: str
    target: str
    read_only: bool = True


UNHEALTHY_AFTER_S = 60
"""A service failing its check this long is marked unhealthy (retries x interval)."""


@dataclass(frozen=True)
class Healthcheck:
    """Each check is an exec in the container: ~120 ms of CPU (75 in dockerd, containerd and runc, 43 in
    promtool itself; measured here at load ~10), which at a 5 s interval on Prometheus and
    Alertmanager and 10 s on TensorBoard cost a stack ~6 % of a core, all run long, beside the
    training it watches. Nothing waits on health but Grafana's start and a Swarm task's Running state,
    so 15 s is soon enough; the check fails a service after UNHEALTHY_AFTER_S either way."""

    test: tuple[str, ...]
    """The command, run in the container (no shell)."""
    interval_s: int = 15
    timeout_s: int = 3

    @property
    def retries(self) -> int:
        return -(-UNHEALTHY_AFTER_S // self.interval_s)


@dataclass(frozen=True, kw_only=True)
class Service:
    """One service, as every target reads it."""

    name: str
    title: str = ""
    """Display name in reports and URLs ("Prometheus"); empty for a trainer task."""
    image: str
    """The image where none is given: `<NAME>_IMAGE` replaces it (image_variable(); Compose writes
    `${PROMETHEUS_IMAGE:-...}`, so `make up` can pick the online or the Debian-built image; Swarm
    takes --<name>-image)."""
    trainer_image: bool = False
    """Runs this deployment's trainer image, as the tasks do (`image` is then only the default tag):
    every target substitutes the one its tasks run (`for_deployment`)."""
    build: bool = False
    """This service builds the image (the chief); other services with the same image never pull it."""
    command: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)
    expose: tuple[int, ...] = ()
    """Ports other services reach inside the networks."""
    publish: tuple[int, ...] = ()
    """Ports published to the host, on BIND_ADDR only (the UIs)."""
    networks: tuple[str, ...] = (MONITORING,)
    fast_dns: bool = False
    """Outside names fail in 1 s: on the internal network a lookup of an outside name (TensorFlow
    probes the GCE metadata server) otherwise waits 10 s for Docker's DNS to give up."""
    init: bool = False
    """tini as PID 1, so SIGTERM reaches the process (Python as PID 1 ignores it)."""
    restart: str = "always"
    """The engine's restart policy. "always", not "unless-stopped": a dockerd that died (SIGKILL, OOM
    kill) kills on its restart the containers it finds still running (live-restore off) as if stopped
    by hand, and leaves unless-stopped ones down (tests/e2e/test_engine_faults.py). `make down`
    removes the containers, so "always" starts nothing the operator stopped that way."""
    stop_grace_s: int | None = None
    user: str
    tmpfs: tuple[str, ...] = ("/tmp",)
    volumes: tuple[tuple[str, str], ...] = ()
    """(named volume, mount point): data that outlives the container."""
    configs: tuple[ConfigDir, ...] = ()
    run_dirs: tuple[RunDir, ...] = ()
    binds: tuple[Bind, ...] = ()
    secrets: tuple[str, ...] = ()
    """File secrets, read from SECRETS_DIR/<name> on the host, at /run/secrets/<name> inside."""
    healthcheck: Healthcheck | None = None
    depends_on: tuple[str, ...] = ()
    """Services that must be healthy before this one starts."""
    optional: bool = False
    """Started only when its image is present (Compose profile of the same name; Swarm: --<name>-image)."""
    elsewhere: str = ""
    """What to do instead on a target that does not run it (Kubernetes; an optional service left out)."""


PROMETHEUS = Service(
    name="prometheus",
    title="Prometheus",
    # Online: the upstream image; offline: Debian's prometheus package (images/images.sh prometheus).
    image="prom/prometheus:v2.55.1",
    command=(
        "--config.file=/etc/prometheus/prometheus.yml",
        "--storage.tsdb.path=/prometheus",
        Interpolated(f"--storage.tsdb.retention.time=${{PROMETHEUS_RETENTION_TIME:-{RETENTION_TIME}}}"),
        Interpolated(f"--storage.tsdb.retention.size=${{PROMETHEUS_RETENTION_SIZE:-{RETENTION_SIZE}}}"),
        # The lifecycle API (POST /-/quit, /-/reload) has no authentication: off unless asked
        # (`make up PROMETHEUS_LIFECYCLE=1` sets --web.enable-lifecycle here).
        Interpolated("${PROMETHEUS_LIFECYCLE_FLAG:---no-web.enable-lifecycle}"),
    ),
    publish=(contract.PROMETHEUS_PORT,),
    networks=(CLUSTER, MONITORING),
    # nobody, as in prom/prometheus; the Debian-built image chowns /prometheus the same way, so one
    # prometheus-data volume works with both images.
    user="65534:65534",
    volumes=(("prometheus-data", "/prometheus"),),  # history survives `make down`; `make clean` removes it
    configs=(
        ConfigDir("monitoring/config/prometheus", "/etc/prometheus", ("prometheus.yml", "rules/*.yml")),
    ),
    run_dirs=(RunDir("targets", "/etc/prometheus/targets"),),
    # promtool is in both images (no wget/curl in the Debian one); 2.42 has no `check ready`.
    healthcheck=Healthcheck(
        ("promtool", "query", "instant", f"http://127.0.0.1:{contract.PROMETHEUS_PORT}", "vector(1)")
    ),
    elsewhere="use the cluster's Prometheus: the PodMonitor selects the trainer pods",
)

ALERTMANAGER = Service(
    name="alertmanager",
    title="Alertmanager",
    # Online: the upstream image; offline: Debian's prometheus-alertmanager (images/images.sh alertmanager).
    image="prom/alertmanager:v0.25.0",
    command=(
        "--config.file=/etc/alertmanager/alertmanager.yml",
        "--storage.path=/alertmanager",
        f"--web.listen-address=:{contract.ALERTMANAGER_PORT}",
        # One instance: no gossip port (HA clustering listens on 9094 on every address by default).
        "--cluster.listen-address=",
    ),
    publish=(contract.ALERTMANAGER_PORT,),
    user="65534:65534",
    volumes=(("alertmanager-data", "/alertmanager"),),  # silences and the notification log
    # The one file users edit: receivers and routes of the training alerts (docs/alerts.md).
    # Credentials (a Slack URL, an SMTP password) go in files under its git-ignored secrets/ folder.
    configs=(
        ConfigDir("monitoring/config/alertmanager", "/etc/alertmanager", ("alertmanager.yml", "secrets/*")),
    ),
    # amtool is in both images; it asks the running Alertmanager's API.
    healthcheck=Healthcheck(
        (
            "amtool",
            f"--alertmanager.url=http://127.0.0.1:{contract.ALERTMANAGER_PORT}",
            "config",
            "show",
        )
    ),
    elsewhere="use the cluster's Alertmanager: load the generated alert rules as a PrometheusRule",
)

GRAFANA = Service(
    name="grafana",
    title="Grafana",
    # No Debian package and no registry offline: only started when the image is present or pullable.
    image="grafana/grafana:11.6.0",
    environment={
        "GF_SECURITY_ADMIN_USER": "admin",
        "GF_SECURITY_ADMIN_PASSWORD__FILE": "/run/secrets/grafana_admin_password",
        "GF_USERS_ALLOW_SIGN_UP": "false",
        "GF_AUTH_ANONYMOUS_ENABLED": "false",
        "GF_ANALYTICS_REPORTING_ENABLED": "false",
        "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
    },
    publish=(contract.GRAFANA_PORT,),
    user="472:0",
    volumes=(("grafana-data", "/var/lib/grafana"),),
    configs=(
        ConfigDir(
            "monitoring/config/grafana/provisioning",
            "/etc/grafana/provisioning",
            ("datasources/*.yml", "dashboards/*.yml"),
        ),
        ConfigDir("monitoring/config/grafana/dashboards", "/var/lib/grafana/dashboards", ("*.json",)),
    ),
    # Random, generated at the first `make up` (git-ignored); never a default password.
    secrets=("grafana_admin_password",),
    depends_on=("prometheus",),
    optional=True,
    elsewhere="load the dashboards into an existing Grafana with `make publish-dashboards`",
)

TENSORBOARD = Service(
    name="tensorboard",
    title="TensorBoard",
    # The trainer image holds tensorboard, its profile plugin (xprof) and TensorFlow, whose trace
    # client `make profile` runs in this container (on the cluster network, with the log volume).
    image=Deployment(workers=0).image("cpu"),
    trainer_image=True,
    command=(
        "tensorboard",
        f"--logdir={LOG_DIR}",
        "--host=0.0.0.0",
        f"--port={contract.TENSORBOARD_PORT}",
        "--reload_interval=5",
    ),
    publish=(contract.TENSORBOARD_PORT,),
    networks=(CLUSTER, MONITORING),
    init=True,
    user=f"{UID}:{GID}",
    # The chief's scalars, a SCRIPT's own summaries, `make profile`'s traces; `make clean` removes it.
    volumes=(("tensorboard-logs", LOG_DIR),),
    # Generous: a Python start plus TensorBoard's answer took over 3 s on the 2 loaded cores.
    healthcheck=Healthcheck(
        (
            "python",
            "-c",
            "import urllib.request as u; "
            f"u.urlopen('http://127.0.0.1:{contract.TENSORBOARD_PORT}/data/logdir', timeout=20)",
        ),
        interval_s=30,
        timeout_s=30,
    ),
    elsewhere=f"run `tensorboard --logdir` on a volume mounted at {LOG_DIR} (TRAINER_LOGDIR) in every pod",
)

SERVICES: tuple[Service, ...] = (PROMETHEUS, ALERTMANAGER, GRAFANA, TENSORBOARD)
"""Every service beside the trainers, in start order (a service after those it depends on)."""


def for_deployment(s: Service, image: str) -> Service:
    """`s` as a deployment whose tasks run `image` runs it."""
    return dataclasses.replace(s, image=image) if s.trainer_image else s


SUPERVISE_DIR = "/var/lib/supervise"
"""trainer.supervise.supervisor's state (runs, budget, a final exit) per container; images/trainer.Dockerfile creates it."""


def trainers(d: Deployment) -> tuple[Service, ...]:
    """One service per task. TF_CONFIG addresses tasks by service name (trainer.cluster.spec's
    COMPOSE_ADDRESS), which every target that runs these services resolves."""
    spec = d.cluster()
    return tuple(_trainer(d, t.name, spec.with_task(t).to_tf_config()) for t in spec.tasks)


def _trainer(d: Deployment, name: str, tf_config: str) -> Service:
    chief = name == contract.CHIEF
    # A SCRIPT's tasks all see the checkpoint volume: Keras' BackupAndRestore restores every task from
    # the one directory (the others write temporary copies there and delete them), as MWMS expects.
    shared = chief or bool(d.script)
    return Service(
        name=name,
        image=d.image("cpu"),
        build=chief,  # built once, on the chief; the other tasks reuse the tag and never pull it
        # trainer.supervise.supervisor restarts the task by exit code, its budget from MAX_RESTARTS (restarts
        # without a new checkpoint), kept with a final exit in SUPERVISE_DIR across container restarts.
        command=tuple(deployment.command(d)),
        environment={
            "TF_CONFIG": tf_config,
            **deployment.trainer_env(d),
            **_export_env(d, chief),
            supervise.STATE_DIR_ENV: SUPERVISE_DIR,
        },
        expose=(contract.TF_PORT, contract.METRICS_PORT, contract.PROFILER_PORT),
        networks=(CLUSTER,),
        fast_dns=True,
        init=True,
        # The engine brings back a container whose processes all died (the engine or the host
        # restarted, PID 1 killed); a final exit stays final in the supervisor's state. `docker kill`
        # counts as a manual stop for Docker: `make wait` starts such a task again (compose/wait.py).
        restart="on-failure",
        stop_grace_s=STOP_GRACE_SECONDS,
        user=f"{UID}:{GID}",
        # Only the chief writes the shared checkpoint volume; other tasks save to a private tmpfs.
        tmpfs=("/tmp",) if shared else ("/tmp", CHECKPOINT_DIR),
        # Every task may write summaries (a SCRIPT's Keras TensorBoard callback writes on workers too),
        # and each task's profiler server writes its own trace there (`make profile`).
        volumes=((("checkpoints", CHECKPOINT_DIR),) if shared else ())
        + (("supervise", SUPERVISE_DIR), ("tensorboard-logs", LOG_DIR)),
        binds=_binds(d) + (_output_bind(d) if chief else ()),
    )


def _export_env(d: Deployment, chief: bool) -> dict[str, str]:
    """The chief copies the final model out of the volume into OUTPUT= at the end (trainer/state/output.py)."""
    return {"TRAINER_EXPORT_DIR": OUTPUT_DIR} if chief and d.output else {}


def _output_bind(d: Deployment) -> tuple[Bind, ...]:
    return (Bind(str(Path(d.output).resolve()), OUTPUT_DIR, read_only=False),) if d.output else ()


def _binds(d: Deployment) -> tuple[Bind, ...]:
    binds = []
    if d.script:
        binds.append(Bind(str(Path(d.script).resolve().parent), SCRIPT_DIR))
    if d.data:
        binds.append(Bind(str(Path(d.data).resolve()), DATA_DIR))
    return tuple(binds)


def run_files(d: Deployment) -> dict[str, str]:
    """The generated files the services' RunDirs hold, by path under --out: Prometheus file_sd, one
    `<task>:<contract.METRICS_PORT>` target per task; the trainer labels its series with the task the same way (kept by
    honor_labels); the project and run labels come from here only (contract.TARGET_LABELS)."""
    run = deployment.target_labels(d)
    targets = [
        {
            "targets": [f"{t.name}:{contract.METRICS_PORT}"],
            "labels": {**run, contract.TASK_TYPE: t.type, contract.TASK_INDEX: str(t.index)},
        }
        for t in d.tasks
    ]
    return {"targets/trainers.json": json.dumps(targets, indent=2) + "\n"}


def volumes(services: tuple[Service, ...]) -> list[str]:
    """Every named volume the services mount, in order met."""
    return list(dict.fromkeys(name for s in services for name, _ in s.volumes))


def secrets(services: tuple[Service, ...]) -> list[str]:
    return list(dict.fromkeys(name for s in services for name in s.secrets))


def config_files(config: ConfigDir, root: Path) -> list[Path]:
    """The files a ConfigDir ships, relative to its source, in the order of its globs."""
    base = root / config.source
    found = [p for pattern in config.files for p in sorted(base.glob(pattern)) if p.is_file()]
    return [p.relative_to(base) for p in dict.fromkeys(found)]


def image_variable(s: Service) -> str:
    """The variable that names a service's image in make and the shell: GRAFANA_IMAGE, ..."""
    return s.name.upper().replace("-", "_") + "_IMAGE"
