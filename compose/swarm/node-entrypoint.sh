#!/bin/sh
# PID 2 of a Docker-in-Docker swarm node (tini is PID 1: `docker run --init`). Replaces what
# --privileged would give, which fails on hosts whose bounding set lacks CAP_SYS_RESOURCE:
# a writable /sys and cgroup tree for runc, shared mount propagation for volumes, and no stale
# pid/socket files from before a `docker kill` (else the restarted dockerd refuses: "pid file found").
set -eu
mount -o remount,rw /sys
for d in /sys/fs/cgroup/*; do mount -o remount,bind,rw "$d" "$d" 2>/dev/null || true; done
mount --make-rshared /
rm -rf /run/docker /run/docker.pid /run/docker.sock /run/containerd
exec dockerd "$@"
