#!/usr/bin/env bash
# `make stack-up`: nodes -> images -> into the nodes (registry by digest, or save|load) -> the stack
# bundle (python -m compose.emit --target swarm, which prints its translation report) -> deploy from the manager.
# Every input arrives through the environment from compose/swarm.mk. Run from the repository root.
set -euo pipefail
# Ports and defaults (DEFAULT_WORKERS, PROMETHEUS_PORT, ...), written once in contract/__init__.py.
eval "$("${PYTHON:-python3}" -m contract --shell)"

SWARM_NAME=${SWARM_NAME:-mwms-swarm}
STACK=${STACK:-$DEFAULT_PROJECT}
SWARM_DIR=${SWARM_DIR:-.run/swarm}
# make checks them at parse time (compose/values.mk); checked again here, run on its own: STACK names
# the folder `rm -rf "/stacks/$STACK"` removes on node-1 (STACK=../var/lib/docker would wipe its engine).
export STACK SWARM_NAME
"${PYTHON:-python3}" -m compose.values --check STACK SWARM_NAME || exit 2
NODES_SH=compose/swarm/nodes.sh
say() { echo "stack-up: $*" >&2; }
export SWARM_NAME SWARM_SUBNET NODES BIND_ADDR

# A bad receiver file would only show as the Alertmanager task restarting on node-1: refuse it before any work.
alerts=${ALERTMANAGER_CONFIG:-monitoring/config/alertmanager/alertmanager.yml}
if command -v "${AMTOOL:-amtool}" >/dev/null; then
  if ! out=$("${AMTOOL:-amtool}" check-config "$alerts" 2>&1); then
    why=$(grep -m1 -o 'FAILED: .*' <<<"$out" || tail -n1 <<<"$out")
    say "ALERTMANAGER_CONFIG=$alerts is not a valid Alertmanager config ($why): fix it, make check-alerts ALERTMANAGER_CONFIG=$alerts"
    exit 2
  fi
fi

"$NODES_SH" up
# The trainer and Prometheus images, built offline exactly as `make up` builds them.
"${PYTHON:-python3}" -m compose.lifecycle images
version=$("${PYTHON:-python3}" -c 'import trainer; print(trainer.__version__)')
trainer=${IMAGE_REPO:-mwms/trainer}:$version-cpu
prometheus=${PROMETHEUS_IMAGE:-mwms/prometheus:2.42.0-bookworm}
alertmanager=${ALERTMANAGER_IMAGE:-mwms/alertmanager:0.25.0-bookworm}

start=$(date +%s)
if [ "${TRANSPORT:-registry}" = registry ]; then
  registry=${REGISTRY:-127.0.0.1:5000}
  # Our own registry when none is given on the nodes' side (NODE_REGISTRY defaults to REGISTRY).
  if [ "${NODE_REGISTRY:-$registry}" = "$registry" ] && [[ $registry == 127.* ]]; then
    REGISTRY_PORT=${registry##*:} "$NODES_SH" registry
    NODE_REGISTRY=$("$NODES_SH" registry-addr)
  fi
  trainer_ref=$("$NODES_SH" push "$trainer" "$registry")
  prometheus_ref=$("$NODES_SH" push "$prometheus" "$registry")
  alertmanager_ref=$("$NODES_SH" push "$alertmanager" "$registry")
  # The same bytes by digest, under the name the nodes reach the registry by.
  trainer_ref=${NODE_REGISTRY:-$registry}/${trainer_ref#*/}
  prometheus_ref=${NODE_REGISTRY:-$registry}/${prometheus_ref#*/}
  alertmanager_ref=${NODE_REGISTRY:-$registry}/${alertmanager_ref#*/}
  # Pulled on every node before the deploy, not by each task as it is scheduled: Prometheus and
  # Alertmanager are small and start first, so a trainer image still pulling (1.7 GB, over a minute
  # on a loaded CI machine) was a target down for TrainerDown's 1 minute: a page for a normal deploy.
  "$NODES_SH" pull "$trainer_ref" "$prometheus_ref" "$alertmanager_ref"
else
  "$NODES_SH" load "$trainer" "$prometheus" "$alertmanager"
  trainer_ref=$trainer prometheus_ref=$prometheus alertmanager_ref=$alertmanager
fi
say "images on the nodes by ${TRANSPORT:-registry} in $(($(date +%s) - start)) s: $trainer_ref"

args=(--workers "${WORKERS:-$DEFAULT_WORKERS}" --nodes "${NODES:-3}" --out "$SWARM_DIR" --image "$trainer_ref"
      --prometheus-image "$prometheus_ref" --alertmanager-image "$alertmanager_ref" --max-restarts "${MAX_RESTARTS:-$DEFAULT_MAX_RESTARTS}" --project "$STACK")
# Trainer knobs (STEPS=, SAVE_EVERY=, any trainer flag) reach the swarm target through the environment.
# SWARM_ENCRYPT=1: IPsec on the overlays, only where every node's kernel has ESP (docs/security.md).
[ "${SWARM_ENCRYPT:-0}" = 1 ] && args+=(--encrypt-overlay)
# TRAINER_NODES=node-1,node-2,...: one task per node (make stack-elastic goes on without a lost one).
[ -n "${TRAINER_NODES:-}" ] && args+=(--trainer-nodes "$TRAINER_NODES")
# ALERTMANAGER_CONFIG: the receivers and routes (default: monitoring/config/alertmanager/alertmanager.yml,
# the file Compose mounts), shipped as a swarm config: edit it and rerun `make stack-up`.
for var in ARGS GRAFANA_IMAGE ALERTMANAGER_CONFIG; do
  [ -n "${!var:-}" ] && args+=("--$(tr 'A-Z_' 'a-z-' <<<"$var")" "${!var}")
done
"${PYTHON:-python3}" -m compose.emit --target swarm "${args[@]}"
# How this bundle was made, for make stack-resize and make stack-elastic (remake.json in the bundle).
PROMETHEUS_URL="http://$("$NODES_SH" ip 1):$PROMETHEUS_PORT" "${PYTHON:-python3}" -m compose.stackresize \
  --dir "$SWARM_DIR" --record --target swarm "${args[@]}"

# The bundle is self-contained: copy it to the manager and deploy there (the host is no swarm member).
# The Swarm target's deploy (compose/targets/swarm.py), under the stack's lock (compose/projectlock.py).
manager=$SWARM_NAME-node-1
STACK=$STACK SWARM_DIR=$SWARM_DIR SWARM_NAME=$SWARM_NAME NODES=${NODES:-3} "${PYTHON:-python3}" -m compose.lifecycle stack-deploy
echo
echo "Prometheus: http://$("$NODES_SH" ip 1):$PROMETHEUS_PORT   (published mode host on node-1)"
echo "Alerts:     http://$("$NODES_SH" ip 1):$ALERTMANAGER_PORT   (receivers: ${ALERTMANAGER_CONFIG:-monitoring/config/alertmanager/alertmanager.yml})"
echo "Follow:     make stack-status STACK=$STACK | docker exec $manager docker service logs -f ${STACK}_chief"
