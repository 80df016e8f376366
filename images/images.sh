#!/usr/bin/env bash
# Images the stack needs, online or air-gapped.
#   images.sh select OFFLINE          print KEY=value lines: the base and Prometheus images to use,
#                                     pulled when OFFLINE=0/auto and a registry answers, else built here
#   images.sh base TAG                Debian bookworm + Python 3.11 rootfs (mmdebstrap) -> docker import
#   images.sh prometheus TAG          Debian's prometheus package (2.42) the same way
#   images.sh alertmanager TAG        Debian's prometheus-alertmanager package (0.25) the same way
#   images.sh fetch LOCK DIR          the hash-locked wheels for cp311 manylinux, downloaded on the host
#                                     into DIR (once per lock; one download at a time per DIR): safe
#                                     beside a running build (make test fetches while the unit tests run)
#   images.sh stage DIR               DIR's wheels staged (hard links) in build/wheelhouse, the build's
#                                     context: only under up.sh's build lock, with the build that reads it
#   images.sh pullable IMAGE          exit 0 when the image (Grafana's, any optional service's) is present or can be pulled
# Containers here cannot reach PyPI and no registry answers, so nothing in a build downloads.
set -euo pipefail

ONLINE_BASE=python:3.11.14-slim-bookworm
ONLINE_PROMETHEUS=prom/prometheus:v2.55.1
ONLINE_ALERTMANAGER=prom/alertmanager:v0.25.0
OFFLINE_BASE=mwms/python:3.11-bookworm
OFFLINE_PROMETHEUS=mwms/prometheus:2.42.0-bookworm
OFFLINE_ALERTMANAGER=mwms/alertmanager:0.25.0-bookworm
SUITE=bookworm
# The locks are compiled for x86_64-manylinux_2_28 (`make lock`): no wheel needs a newer glibc.
MANYLINUX_MAX=28
MIRRORS=("deb http://deb.debian.org/debian $SUITE main"
         "deb http://deb.debian.org/debian $SUITE-updates main"
         "deb http://deb.debian.org/debian-security $SUITE-security main")
# Docs, man pages, locales and moment-timezone's 227 MB of data are never read in a container.
SLIM=(--variant=minbase --aptopt='APT::Install-Recommends "false"'
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*'
      --dpkgopt='path-exclude=/usr/share/javascript/moment-timezone/data/*')

say() { echo "images: $*" >&2; }
# Each step prints one line; pip's and mmdebstrap's output go to the log that line names.
. "$(dirname "$0")/quiet.sh"
LOGS=${LOGS:-build/logs}
present() { docker image inspect "$1" >/dev/null 2>&1; }
pullable() { present "$1" || timeout 120 docker pull -q "$1" >/dev/null 2>&1; }

select_images() {
  local offline=${1:-auto}
  # auto: whatever is already here wins (no pull attempt, no registry timeout on air-gapped hosts).
  if [ "$offline" = auto ] && present "$OFFLINE_BASE" && ! present "$ONLINE_BASE"; then offline=1; fi
  if [ "$offline" != 1 ] && pullable "$ONLINE_BASE" && pullable "$ONLINE_PROMETHEUS" \
     && pullable "$ONLINE_ALERTMANAGER"; then
    echo "BASE_IMAGE=$ONLINE_BASE"; echo "PROMETHEUS_IMAGE=$ONLINE_PROMETHEUS"
    echo "ALERTMANAGER_IMAGE=$ONLINE_ALERTMANAGER"
  else
    [ "$offline" = 1 ] || say "no registry answers: building base images from Debian packages (OFFLINE=1)"
    echo "BASE_IMAGE=$OFFLINE_BASE"; echo "PROMETHEUS_IMAGE=$OFFLINE_PROMETHEUS"
    echo "ALERTMANAGER_IMAGE=$OFFLINE_ALERTMANAGER"
  fi
}

build_base() {
  present "$1" && return 0
  quietly "$LOGS/base.log" "images: building $1 with mmdebstrap (~40 s)" debootstrap_base "$1"
}

debootstrap_base() {
  mmdebstrap "${SLIM[@]}" --include=python3,python3-venv,ca-certificates "$SUITE" - "${MIRRORS[@]}" \
    | docker import -c 'ENV LANG=C.UTF-8' -c 'CMD ["python3"]' - "$1"
}

build_prometheus() {
  present "$1" && return 0
  quietly "$LOGS/prometheus.log" "images: building $1 from Debian's prometheus package" debootstrap_prometheus "$1"
}

debootstrap_prometheus() {
  # uid/gid 65534 (nobody) owns the data directory, as in prom/prometheus, so the same
  # prometheus-data volume works with either image.
  mmdebstrap "${SLIM[@]}" --include=prometheus \
    --customize-hook='mkdir -p "$1/prometheus" && chown 65534:65534 "$1/prometheus"' "$SUITE" - "${MIRRORS[@]}" \
    | docker import -c 'USER 65534:65534' -c 'WORKDIR /prometheus' -c 'EXPOSE 9090' \
        -c 'ENTRYPOINT ["/usr/bin/prometheus"]' \
        -c 'CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]' \
        - "$1"
}

build_alertmanager() {
  present "$1" && return 0
  say "building $1 from Debian's prometheus-alertmanager package"
  # As prom/alertmanager: uid 65534 owns the data directory (silences, notification log), the binary
  # is the entrypoint; Debian names it prometheus-alertmanager and ships amtool beside it.
  mmdebstrap -q "${SLIM[@]}" --include=prometheus-alertmanager \
    --customize-hook='mkdir -p "$1/alertmanager" && chown 65534:65534 "$1/alertmanager"' "$SUITE" - "${MIRRORS[@]}" \
    | docker import -c 'USER 65534:65534' -c 'WORKDIR /alertmanager' -c 'EXPOSE 9093' \
        -c 'ENTRYPOINT ["/usr/bin/prometheus-alertmanager"]' \
        -c 'CMD ["--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager"]' \
        - "$1" >/dev/null
}

fetch() {
  local lock=$1 dir=$2
  # The stamp holds the lock's hash: a changed lock means a fresh wheelhouse, nothing stale left.
  local want; want=$(sha256sum "$lock" | cut -d' ' -f1)
  # One download per DIR at a time: two make ups side by side would each empty it under the other.
  mkdir -p "$(dirname "$dir")"
  exec 7>"$dir.fetch-lock"
  flock 7
  [ "$(cat "$dir/.lock-sha256" 2>/dev/null)" = "$want" ] || download "$lock" "$dir" "$want"
  flock -u 7; exec 7>&-
}

stage() {
  # The build context gets this variant's wheels only, as hard links in build/wheelhouse: with both
  # wheelhouses in it, every CPU build would also send the GPU's 3.3 GB to the builder. Restaged while
  # another build read it (a CPU make up beside the GPU image's build, make test's side-by-side stage),
  # that build met missing and empty wheels ("Got e3b0c442...", the empty file's hash): up.sh stages
  # under its build lock, just before its own build.
  local dir=$1 staged; staged="$(dirname "$dir")/wheelhouse"
  rm -rf "$staged" && cp -al "$dir" "$staged"
}

download() {
  local lock=$1 dir=$2 want=$3
  rm -rf "$dir"; mkdir -p "$dir"
  # pip does not widen --platform: every manylinux tag the lock may have picked is listed (it is
  # compiled for manylinux_2_28; the nvidia-* wheels use 2_25 and 2_27). --no-deps because the lock
  # is the full closure (and tf-keras must not pull the GPU tensorflow next to tensorflow-cpu).
  local platforms=(--platform manylinux2014_x86_64)
  for minor in $(seq 17 "$MANYLINUX_MAX"); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
  quietly "$LOGS/wheelhouse-$(basename "$lock" .lock).log" "images: downloading the wheelhouse for $lock into $dir" \
    "${PYTHON:-python3}" -m pip download --no-deps --require-hashes --only-binary=:all: "${platforms[@]}" \
    --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none -r "$lock" -d "$dir"
  cp "$lock" "$dir/requirements.lock"
  echo "$want" >"$dir/.lock-sha256"
}

case "${1:-}" in
  select) select_images "${2:-auto}" ;;
  base) build_base "$2" ;;
  prometheus) build_prometheus "$2" ;;
  alertmanager) build_alertmanager "$2" ;;
  fetch) fetch "$2" "$3" ;;
  stage) stage "$2" ;;
  pullable | grafana) pullable "$2" ;;
  *) echo "usage: $0 select|base|prometheus|alertmanager|fetch|stage|pullable ..." >&2; exit 2 ;;
esac
