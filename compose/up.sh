#!/usr/bin/env bash
# `make up`: engine -> images -> generated compose files -> build once -> start -> print URLs.
# Stack settings arrive through the environment from compose/compose.mk's STACK_VARS (WORKERS, GPUS, ...);
# trainer knobs (STEPS=, TASK=, any trainer flag upper-cased) pass through it untouched to
# the Compose target (python -m compose.emit --target compose), which reads them (compose/knobs.py).
# Run from the repository root. `up.sh --build-only` stops after building (make images); `up.sh --check`
# after step 0's refusals (make resize, before it stops a task).
set -euo pipefail
# Ports and defaults (DEFAULT_WORKERS, PROMETHEUS_PORT, ...), written once in contract/__init__.py.
eval "$("${PYTHON:-python3}" -m contract --shell)"

RUN_DIR=${RUN_DIR:-.run}
SECRETS_DIR=${SECRETS_DIR:-secrets}
# The optional services of compose/services.py and their images (OPTIONAL_SERVICES, GRAFANA_IMAGE, ...).
eval "$("${PYTHON:-python3}" -m compose.services)"
say() { echo "up: $*" >&2; }
starting=1; [ "${1:-}" = --build-only ] && starting=0

# 0. Refusals, each one line, before any download, build or container (compose/preflight.py). One
#    `make up` of a project at a time: a second one while the first starts would race it for the
#    same containers and volumes. The lock is released when this script exits, however it exits.
mkdir -p "$RUN_DIR"
exec 9>"$RUN_DIR/.up.lock"
if [ $starting = 0 ]; then
  # make images beside another build of the project (.ci/run's make test-images and make test's): it
  # waits, then finds the images in the cache (refused, make test's had left the images to its tests).
  flock 9
elif ! flock -n 9; then
  say "PROJECT=${PROJECT:-$DEFAULT_PROJECT} is already starting (another make up holds $RUN_DIR/.up.lock): wait for it to finish, or make down PROJECT=${PROJECT:-$DEFAULT_PROJECT}"
  exit 2
fi
# The GPU image builds on any host (make images-gpu): only a start needs the GPUs asked for.
check=(--project "${PROJECT:-$DEFAULT_PROJECT}" --bind-addr "${BIND_ADDR:-127.0.0.1}" --workers "${WORKERS:-$DEFAULT_WORKERS}"
       --gpus "$([ $starting = 1 ] && echo "${GPUS:-auto}" || echo 0)")
[ $starting = 1 ] && check+=(--starting)
"${PYTHON:-python3}" -m compose.preflight "${check[@]}"

# A new run id at every `make up`: a label on every series (with the project), so status, diagnose,
# report, alerts and dashboards never mix this run with an earlier one still in Prometheus.
RUN=$("${PYTHON:-python3}" -c 'from compose.deployment import run_id; print(run_id())')
args=(--workers "${WORKERS:-$DEFAULT_WORKERS}" --out "$RUN_DIR" --project "${PROJECT:-$DEFAULT_PROJECT}" --run "$RUN"
      --gpus "${GPUS:-auto}" --gpus-per-worker "${GPUS_PER_WORKER:-1}" --max-restarts "${MAX_RESTARTS:-$DEFAULT_MAX_RESTARTS}"
      --image-repo "${IMAGE_REPO:-mwms/trainer}" --args "${ARGS:-}")
[ -n "${SCRIPT:-}" ] && args+=(--script "$SCRIPT")
[ -n "${DATA:-}" ] && args+=(--data "$DATA")
# OUTPUT: where the chief copies the final model and summary (trainer/state/output.py). A folder made here is
# given to the containers' user (uid 1000); one of yours is checked, and the chmod that fixes it said.
if [ -n "${OUTPUT:-}" ]; then
  if [ ! -d "$OUTPUT" ]; then
    mkdir -p "$OUTPUT"
    [ "$(id -u)" = 0 ] && chown 1000:1000 "$OUTPUT"
  fi
  args+=(--output "$OUTPUT")
fi
# make tune's winner (RUN_DIR/tuned.env): each setting not given on the command line, and a line saying so.
. compose/tuned.sh
[ $starting = 1 ] && use_tuned "$RUN_DIR/tuned.env" "$([ "${1:-}" = --check ] && echo 1 || echo 0)"
# The job's own settings (STEPS, TASK, SCRIPT, DATA, every knob) are checked here too, written in step 2.
[ $starting = 1 ] && "${PYTHON:-python3}" -m compose.emit --target compose "${args[@]}" --check
[ "${1:-}" = --check ] && exit 0

compose/engine.sh ensure

# 1. Base and Prometheus images: pulled when a registry answers, else built from Debian packages.
eval "$(images/images.sh select "${OFFLINE:-auto}")"
#    The three Debian builds are independent and mostly wait on the mirrors: side by side, each one's
#    line printed whole when it ends (cold, beside .ci/run's installs: ~92 s in all, against 62 + 53 +
#    ~75 s one after another).
if [[ $BASE_IMAGE == mwms/* ]]; then
  mkdir -p "$RUN_DIR/logs"
  kinds=(base prometheus alertmanager) pids=() failed=0
  for kind in "${kinds[@]}"; do
    image_var="$(tr 'a-z' 'A-Z' <<<"$kind")_IMAGE"  # BASE_IMAGE, PROMETHEUS_IMAGE, ALERTMANAGER_IMAGE
    images/images.sh "$kind" "${!image_var}" 2>"$RUN_DIR/logs/$kind-image.said" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  for kind in "${kinds[@]}"; do cat "$RUN_DIR/logs/$kind-image.said" >&2; done
  [ $failed = 0 ] || exit 1
fi

# 2. Compose files and Prometheus targets for a chief plus $WORKERS workers (the settings checked in 0.).
"${PYTHON:-python3}" -m compose.emit --target compose "${args[@]}" --base-image "$BASE_IMAGE"
# What `make resize` needs to start this job again at another size: the settings given on make's
# command line (but the size and the project's own) and TRAINER_* from the environment.
{
  given=""
  for name in ${MAKE_COMMAND_LINE:-}; do
    case $name in WORKERS | PROJECT | RUN_DIR | PYTHON) continue ;; esac
    [[ $name =~ ^[A-Z][A-Z0-9_]*$ ]] || continue
    printf '%s=%q\n' "$name" "${!name:-}"
    given="$given $name"
  done
  while IFS= read -r kv; do printf '%s=%q\n' "${kv%%=*}" "${kv#*=}"; done < <(env | grep -E '^TRAINER_[A-Z_]+=' || true)
  printf 'UP_KNOBS=%q\n' "${given# }"
} >"$RUN_DIR/knobs.env"
variant=cpu; [ -f "$RUN_DIR/compose.gpu.yaml" ] && variant=gpu

# 3. Wheels on the host (containers cannot reach PyPI), checked against the hash lock.
images/images.sh fetch "images/requirements-$variant.lock" "build/wheelhouse-$variant"

# 4. Each optional service (Grafana) only when its image is here or pullable (its Compose profile);
#    Grafana with a random admin password (never admin/admin).
profiles=""
for service in $OPTIONAL_SERVICES; do
  image_var="$(tr 'a-z-' 'A-Z_' <<<"$service")_IMAGE"
  if images/images.sh pullable "${!image_var}"; then profiles="${profiles:+$profiles,}$service"; fi
done
if [[ ,$profiles, == *,grafana,* ]]; then
  if [ ! -s "$SECRETS_DIR/grafana_admin_password" ]; then
    mkdir -p "$SECRETS_DIR" && chmod 700 "$SECRETS_DIR"
    # 0644 inside a 0700 directory: readable by Grafana's uid 472 in the container, by no other host user.
    (umask 022; head -c 32 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 24 >"$SECRETS_DIR/grafana_admin_password")
    say "Grafana admin password generated in $SECRETS_DIR/grafana_admin_password"
  fi
fi

# 5. What every later `docker compose` call (down, logs, status, wait) needs to see the same stack.
cat >"$RUN_DIR/stack.env" <<EOF
COMPOSE_PROJECT_NAME=${PROJECT:-$DEFAULT_PROJECT}
COMPOSE_PROFILES=$profiles
RUN=$RUN
PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE
ALERTMANAGER_IMAGE=$ALERTMANAGER_IMAGE
PROMETHEUS_RETENTION_TIME=${PROMETHEUS_RETENTION_TIME:-}
PROMETHEUS_RETENTION_SIZE=${PROMETHEUS_RETENTION_SIZE:-}
PROMETHEUS_LIFECYCLE_FLAG=$([ "${PROMETHEUS_LIFECYCLE:-0}" != 1 ] || echo --web.enable-lifecycle)
BIND_ADDR=${BIND_ADDR:-127.0.0.1}
RUN_DIR=$(realpath "$RUN_DIR")
SECRETS_DIR=$(realpath -m "$SECRETS_DIR")
EOF
for service in $OPTIONAL_SERVICES; do
  image_var="$(tr 'a-z-' 'A-Z_' <<<"$service")_IMAGE"
  echo "$image_var=${!image_var}" >>"$RUN_DIR/stack.env"
done
# shellcheck disable=SC2046  # compose.args is a list of -f options
dc() { docker compose --project-directory . --env-file "$RUN_DIR/stack.env" $(cat "$RUN_DIR/compose.args") "$@"; }

# Compose's own builder, which drives the daemon's BuildKit (RUN --mount works). Its alternative, Bake,
# needs the buildx plugin, which these hosts do not have (engine.sh pins the Compose version that still
# has the builder; COMPOSE_BAKE=false selects it). The builder's output goes to a log: one line here.
. images/quiet.sh
# Under one project name whatever the stack's: Compose writes the project into the image's labels, so
# two projects' builds of the same code were two image ids under one tag. Each build moved the tag and
# pruned the other's image, and make stack-up's push could not untag what a running container used
# ("unable to remove repository reference ... must force"). A `docker run` of the image inherited a
# stack's project label too.
BUILD_PROJECT=mwms-image
build_chief() { COMPOSE_BAKE=false dc -p "$BUILD_PROJECT" --progress plain build chief; }

# 6. Build once, on the chief. Then free our superseded images. The builder's copy of the build context
#    stays (~420 MB of wheels for the CPU image, 3.5 GB for the GPU one; `make prune` frees it): dropped,
#    every make up sent it all again (CPU: 4.8 s and ~4.5 CPU-s in the client and the daemon against 0.7 s
#    and 0.35; GPU: 25 s against 1.7). One copy for both variants: a build of the other sends its wheels.
# One build at a time on this engine: two make ups side by side (two projects, or make test's
# side-by-side stage) would restage the build context the other is still reading. Released below.
exec 8>"${TMPDIR:-/tmp}/mwms-build.lock"
flock 8
images/images.sh stage "build/wheelhouse-$variant"  # the context this build reads, no other's
quietly "$RUN_DIR/logs/build.log" "up: building ${IMAGE_REPO:-mwms/trainer} ($variant) on the chief service (cold: ~1 min; warm: cached)" build_chief
docker image prune -f --filter label=org.mwms.image=trainer >/dev/null
flock -u 8; exec 8>&-
[ "${1:-}" = --build-only ] && exit 0
# 7. Before any task starts: does the checkpoint volume fit this job (its settings, a step below STEPS)?
#    Skipped checkpoints are named; a refusal is its reason and the ways on, exit 2 (trainer/state/manifest.py).
#    At or past STEPS (10): no trainer starts, the monitoring does (the finished job's history stays visible).
#    A checkpoint of another world size goes on (a resize: one line says what changed, trainer/state/resize.py).
rc=0
replicas=$(( ${WORKERS:-$DEFAULT_WORKERS} + 1 )); [ $variant = gpu ] && replicas=$(( replicas * ${GPUS_PER_WORKER:-1} ))
# A SCRIPT= run's checkpoints are its own (TRAINER_CHECKPOINT_DIR, compose/deployment.py): only said.
manifest=(--checkpoint-dir /checkpoints --replicas "$replicas"); [ -n "${SCRIPT:-}" ] && manifest+=(--script)
dc run --rm --no-deps -T chief python -m trainer.state.manifest "${manifest[@]}" || rc=$?
if [ "$rc" = 10 ]; then
  # shellcheck disable=SC2046  # a list of service names
  dc up -d --no-build --remove-orphans --quiet-pull $(dc config --services | grep -vxE 'chief|worker-[0-9]+')
  say "no trainer started: nothing to train (above); Prometheus and Grafana show the finished job"
elif [ "$rc" != 0 ]; then
  exit "$rc"
else
  dc up -d --no-build --remove-orphans --quiet-pull
fi

addr=${BIND_ADDR:-127.0.0.1}
# Another project's commands need its name: they find its RUN_DIR and Prometheus from it.
p=""; [ "${PROJECT:-$DEFAULT_PROJECT}" = "$DEFAULT_PROJECT" ] || p=" PROJECT=$PROJECT"
echo
echo "Prometheus: http://$addr:$PROMETHEUS_PORT   (targets: http://$addr:$PROMETHEUS_PORT/targets)"
echo "Alerts:     http://$addr:$ALERTMANAGER_PORT   (Alertmanager; receivers: monitoring/config/alertmanager/alertmanager.yml, docs/alerts.md)"
echo "TensorBoard: http://$addr:$TENSORBOARD_PORT   (make profile$p fills its PROFILE tab)"
if [[ ,$profiles, == *,grafana,* ]]; then
  echo "Grafana:    http://$addr:$GRAFANA_PORT   (user admin, password in $SECRETS_DIR/grafana_admin_password)"
else
  cat <<EOF
Grafana:    skipped - image $GRAFANA_IMAGE is not present and cannot be pulled (offline).
            To see the dashboards, load monitoring/config/grafana/dashboards/*.json into an existing Grafana:
            make publish-dashboards GRAFANA_URL=https://grafana.example GRAFANA_TOKEN=...
EOF
fi
echo "Follow:     make status$p (per-task table) | make logs$p | make wait$p (blocks, returns the chief's exit code)"
echo "Unattended: keep make wait$p running: it starts again a task killed from outside (docker kill), which Docker leaves down"
echo "Stop:       make down$p (keeps checkpoints and history) | make clean$p (removes them)"
# An if, not `&&`: as the last command a false test was the script's exit status (1 after a good start).
if [ -n "${OUTPUT:-}" ]; then echo "Model:      $OUTPUT/model (SavedModel) and $OUTPUT/summary.json when the job is done"; fi
