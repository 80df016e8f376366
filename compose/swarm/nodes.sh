#!/usr/bin/env bash
# A Docker Swarm of Docker-in-Docker nodes on this host, for trying and testing the stack across
# "hosts". The host's own engine never enters swarm mode: every swarm command runs in a node.
#   nodes.sh image                 the node image (Debian's docker.io, built offline), cached by tag
#   nodes.sh up                    network, NODES nodes, swarm init/join, node labels (idempotent)
#   nodes.sh down                  remove the nodes, their volumes, the network and the registry
#   nodes.sh load IMAGE...         docker save | docker load into every node, in parallel
#   nodes.sh registry              start Debian's docker-registry (distribution 2.8) on BIND_ADDR:REGISTRY_PORT
#   nodes.sh push IMAGE REGISTRY   push IMAGE to REGISTRY, print its pinned reference (repo@sha256:...)
#   nodes.sh pull REF...           docker pull REF... on every node, in parallel
#   nodes.sh kill N | start N      SIGKILL a node's container (a host crash) / start it again
#   nodes.sh run N [OPTS] -- [ARGS]  only node N (its network too), no swarm: docker run OPTS, ARGS after the image
# Settings (environment): SWARM_NAME (names of everything), NODES, MANAGERS, SWARM_SUBNET, GPU_NODE.
set -euo pipefail

NAME=${SWARM_NAME:-mwms-swarm}
NODES=${NODES:-3}
# Nodes 1..MANAGERS are managers: 3 keep the Raft quorum when any one is lost for good (a lost only
# manager ends the swarm: its workers keep their containers but nothing reschedules them).
MANAGERS=${MANAGERS:-$((NODES < 3 ? NODES : 3))}
# A /24 for the nodes (fixed IPs .11, .12, ...; the host is .1) and a pool for the swarm's own
# overlay networks: both picked away from Docker's default pools (172.17+/16, 192.168/16).
SUBNET=${SWARM_SUBNET:-10.210.0}
POOL=${SWARM_POOL:-10.211.0.0/16}
REGISTRY_PORT=${REGISTRY_PORT:-5000}
# The host side of the registry (pushes): any 127/8 address is an insecure registry by default.
BIND_ADDR=${BIND_ADDR:-127.0.0.1}
# The node whose engine advertises fake GPUs (generic resource GPU=fake-0,fake-1); 0 for none.
GPU_NODE=${GPU_NODE:-3}
SUITE=bookworm
MIRRORS=("deb http://deb.debian.org/debian $SUITE main"
         "deb http://deb.debian.org/debian-security $SUITE-security main")
HERE=$(cd "$(dirname "$0")" && pwd)
ENTRYPOINT=$HERE/node-entrypoint.sh
# The tag changes with the entrypoint, so an edit rebuilds and an unchanged tree never does.
IMAGE=mwms/swarm-node:20.10-$(sha256sum "$ENTRYPOINT" | cut -c1-12)

say() { echo "swarm: $*" >&2; }
node() { echo "$NAME-node-$1"; }
ip() { echo "$SUBNET.$((10 + $1))"; }
in_node() { local n=$1; shift; docker exec "$(node "$n")" docker "$@"; }

build_image() {
  docker image inspect "$IMAGE" >/dev/null 2>&1 && { echo "$IMAGE"; return 0; }
  say "building $IMAGE with mmdebstrap (~60 s)"
  mmdebstrap -q --variant=minbase --aptopt='APT::Install-Recommends "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --include=docker.io,iptables,ca-certificates,procps,iproute2 \
    --customize-hook="cp '$ENTRYPOINT' \"\$1/usr/local/bin/node-entrypoint.sh\"" \
    "$SUITE" - "${MIRRORS[@]}" \
    | docker import -c 'ENTRYPOINT ["/usr/local/bin/node-entrypoint.sh"]' -c 'VOLUME /var/lib/docker' \
        - "$IMAGE" >/dev/null
  echo "$IMAGE"
}

wait_engine() {
  local n=$1
  for _ in $(seq 300); do in_node "$n" info >/dev/null 2>&1 && return 0; sleep 0.2; done
  say "the engine in $(node "$n") did not start: docker logs $(node "$n")"; return 1
}

# run_node N [docker run options...] -- [arguments after the image...]: node N's container, detached.
run_node() {
  local n=$1 opts=(); shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  # --privileged fails here ("unable to apply caps"): the host's bounding set lacks CAP_SYS_RESOURCE
  # and 20.10 ignores --cap-drop next to --privileged. These flags give dockerd what it needs.
  docker run -d --name "$(node "$n")" --hostname "node-$n" --init \
    --cap-add ALL --cap-drop SYS_RESOURCE \
    --security-opt seccomp=unconfined \
    --security-opt systempaths=unconfined --device-cgroup-rule 'a *:* rwm' \
    --network "$NAME" --ip "$(ip "$n")" -v "$(node "$n")-lib:/var/lib/docker" \
    --label org.mwms.swarm="$NAME" "${opts[@]}" "$IMAGE" "$@" >/dev/null
}

start_node() {
  local n=$1 extra=()
  [ "$n" = "$GPU_NODE" ] && extra=(--node-generic-resource GPU=fake-0 --node-generic-resource GPU=fake-1)
  run_node "$n" -- --insecure-registry "$(registry_addr)" "${extra[@]}"
}

net() {
  docker network create --subnet "$SUBNET.0/24" --gateway "$SUBNET.1" --label org.mwms.swarm="$NAME" "$NAME" >/dev/null
}

up() {
  build_image >/dev/null
  docker network inspect "$NAME" >/dev/null 2>&1 || net
  local fresh=()
  for n in $(seq "$NODES"); do
    if ! docker container inspect "$(node "$n")" >/dev/null 2>&1; then start_node "$n"; fresh+=("$n")
    elif [ "$(docker inspect -f '{{.State.Running}}' "$(node "$n")")" != true ]; then docker start "$(node "$n")" >/dev/null
    fi
  done
  for n in $(seq "$NODES"); do wait_engine "$n"; done
  # The swarm lives on in any manager left: a node removed for good and made again joins it.
  local lead; lead=$(lead_manager)
  if [ -z "$lead" ]; then
    in_node 1 swarm init --advertise-addr "$(ip 1)" --default-addr-pool "$POOL" >/dev/null; lead=1
  fi
  for n in "${fresh[@]}"; do forget "$lead" "$n"; done
  local worker manager; worker=$(in_node "$lead" swarm join-token -q worker); manager=$(in_node "$lead" swarm join-token -q manager)
  for n in $(seq "$NODES"); do
    local token=$worker; [ "$n" -le "$MANAGERS" ] && token=$manager
    [ "$(in_node "$n" info -f '{{.Swarm.LocalNodeState}}')" = active ] \
      || in_node "$n" swarm join --token "$token" "$(ip "$lead"):2377" >/dev/null
  done
  label_nodes "$lead"
  say "$NODES nodes up, managers $(node 1)..$(node "$MANAGERS") ($(ip 1)...); docker exec $(node "$lead") docker node ls"
}

lead_manager() {
  for n in $(seq "$NODES"); do
    [ "$(in_node "$n" info -f '{{.Swarm.ControlAvailable}}' 2>/dev/null)" = true ] && { echo "$n"; return 0; }
  done
  return 0  # none: a new swarm (set -e must not end the caller's assignment)
}

forget() {
  # What an operator does for a host lost for good: its Down record goes (demoted first if a manager),
  # so its successor joins under the same name and label without an ambiguous twin.
  local lead=$1 n=$2 id
  for id in $(in_node "$lead" node ls -q --filter "name=node-$n"); do
    [ "$(in_node "$lead" node inspect -f '{{.Status.State}} {{.Description.Hostname}}' "$id")" = "down node-$n" ] || continue
    in_node "$lead" node demote "$id" >/dev/null 2>&1 || true
    in_node "$lead" node rm --force "$id" >/dev/null
  done
}

label_nodes() {
  # Labels before any deploy: on 20.10 a later change to a GPU node's record rejects its running
  # GPU task (moby/moby#44378), so a node that has its label is left alone.
  local lead=${1:-1} id
  for n in $(seq "$NODES"); do
    id=$(in_node "$n" info -f '{{.Swarm.NodeID}}')
    [ "$(in_node "$lead" node inspect -f '{{index .Spec.Labels "org.mwms.node"}}' "$id")" = "node-$n" ] \
      || in_node "$lead" node update --label-add "org.mwms.node=node-$n" "$id" >/dev/null
  done
}

down() {
  for n in $(seq "$NODES"); do docker rm -f -v "$(node "$n")" >/dev/null 2>&1 || true; done
  for n in $(seq "$NODES"); do docker volume rm "$(node "$n")-lib" >/dev/null 2>&1 || true; done
  docker rm -f "$NAME-registry" >/dev/null 2>&1 || true
  docker network rm "$NAME" >/dev/null 2>&1 || true
  docker volume rm "$NAME-registry" >/dev/null 2>&1 || true
  say "removed $NAME nodes, volumes, network and registry"
}

load() {
  local tar; tar=$(mktemp -d)/images.tar
  docker save "$@" -o "$tar"
  local pids=()
  for n in $(seq "$NODES"); do docker exec -i "$(node "$n")" docker load -q <"$tar" >/dev/null & pids+=($!); done
  local rc=0; for p in "${pids[@]}"; do wait "$p" || rc=1; done
  rm -rf "$(dirname "$tar")"
  return $rc
}

pull() {
  local pids=() ref n
  for n in $(seq "$NODES"); do
    (for ref in "$@"; do in_node "$n" pull -q "$ref" >/dev/null || exit 1; done) & pids+=($!)
  done
  local rc=0 p; for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}

registry_addr() { echo "$SUBNET.10:5000"; }

registry() {
  # Debian's docker-registry (distribution 2.8.2), unpacked from its .deb and run in a node-image
  # container on the swarm network at a fixed address; published on loopback for the host's pushes
  # (127/8 is an insecure registry by default: no daemon change on the host).
  docker container inspect "$NAME-registry" >/dev/null 2>&1 && return 0
  local dir; dir=$(realpath -m build/registry)
  if [ ! -x "$dir/usr/bin/docker-registry" ]; then
    say "fetching Debian's docker-registry package"
    mkdir -p "$dir" && (cd "$dir" && apt-get download -q docker-registry >/dev/null) \
      && dpkg-deb -x "$dir"/docker-registry_*.deb "$dir"
  fi
  docker network inspect "$NAME" >/dev/null 2>&1 || net
  docker run -d --name "$NAME-registry" --label org.mwms.swarm="$NAME" --network "$NAME" --ip "$SUBNET.10" \
    -p "$BIND_ADDR:$REGISTRY_PORT:5000" -v "$dir:/opt/registry:ro" -v "$NAME-registry:/var/lib/docker-registry" \
    -v "$HERE/registry.yml:/etc/registry.yml:ro" --entrypoint /opt/registry/usr/bin/docker-registry \
    "$(build_image)" serve /etc/registry.yml >/dev/null
  # docker-proxy accepts connections before the registry listens (and resets them): wait for an HTTP answer.
  local url="http://$BIND_ADDR:$REGISTRY_PORT/v2/"
  for _ in $(seq 150); do
    python3 -c "import urllib.request as u; u.urlopen('$url', timeout=2)" 2>/dev/null && break; sleep 0.2
  done
  say "registry: $BIND_ADDR:$REGISTRY_PORT from the host, $(registry_addr) from the nodes"
}

push() {
  # Prints REGISTRY/repo@sha256:...: a stack deployed by digest runs exactly the pushed bytes.
  local image=$1 reg=$2 repo=${1%%:*}
  docker tag "$image" "$reg/$image"
  docker push -q "$reg/$image" >/dev/null
  local digest; digest=$(docker image inspect -f '{{join .RepoDigests "\n"}}' "$reg/$image" | grep "^$reg/$repo@" | head -1)
  docker rmi "$reg/$image" >/dev/null
  echo "$digest"
}

case "${1:-}" in
  image) build_image ;;
  up) up ;;
  down) down ;;
  load) shift; load "$@" ;;
  registry) registry ;;
  push) push "$2" "$3" ;;
  pull) shift; pull "$@" ;;
  run) shift; n=$1; shift; build_image >/dev/null; docker network inspect "$NAME" >/dev/null 2>&1 || net
       run_node "$n" "$@" && wait_engine "$n" ;;
  kill) docker kill "$(node "$2")" >/dev/null ;;
  start) docker start "$(node "$2")" >/dev/null && wait_engine "$2" ;;
  ip) ip "$2" ;;
  registry-addr) registry_addr ;;
  *) sed -n '2,13p' "$0" >&2; exit 2 ;;
esac
