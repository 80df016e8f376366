#!/usr/bin/env bash
# What an encrypted overlay costs on the Docker-in-Docker swarm (compose/swarm/nodes.sh up, 2+ nodes):
# TCP throughput between a container on node-2 and one on node-1, over a plain overlay and over an
# encrypted one (IPsec ESP, `--opt encrypted`), ROUNDS rounds alternating, SECONDS_PER s each.
# Prints every round, min/median/max per network, the ratio of medians, and the machine's load.
# 0.000 Gbit/s: no connection at all (a kernel without ESP: dockerd logs "Failed Adding ... SA ...
# function not implemented", the policy is installed without its SAs, and every packet is dropped).
#   SWARM_NAME=alerts compose/swarm/overlay-cost.sh
set -euo pipefail

NAME=${SWARM_NAME:-mwms-swarm}
ROUNDS=${ROUNDS:-3}
SECONDS_PER=${SECONDS_PER:-5}
IMAGE=${IMAGE:-mwms/python:3.11-bookworm}
one=$NAME-node-1 two=$NAME-node-2
say() { echo "overlay-cost: $*" >&2; }

SERVER='import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("", 5201)); s.listen()
while True:
    c, _ = s.accept()
    while c.recv(1 << 20):
        pass
    c.close()'
CLIENT='import socket, sys, time
host, seconds = sys.argv[1], float(sys.argv[2])
for attempt in range(10):
    try:
        c = socket.create_connection((host, 5201), timeout=5); break
    except OSError:
        time.sleep(1)
else:
    print("0.000"); sys.exit()  # no connection at all: the network passes no traffic
buf, sent, start = b"x" * (1 << 20), 0, time.monotonic()
while time.monotonic() - start < seconds:
    c.sendall(buf); sent += len(buf)
c.close(); print(f"{sent * 8 / (time.monotonic() - start) / 1e9:.3f}")'

for node in "$one" "$two"; do
  docker exec "$node" docker image inspect "$IMAGE" >/dev/null 2>&1 || docker save "$IMAGE" | docker exec -i "$node" docker load -q >/dev/null
done
for net in plain encrypted; do
  opts=(); [ $net = encrypted ] && opts=(--opt encrypted)
  docker exec "$one" docker network inspect "cost-$net" >/dev/null 2>&1 \
    || docker exec "$one" docker network create -d overlay --attachable "${opts[@]}" "cost-$net" >/dev/null
  docker exec "$two" docker rm -f "srv-$net" >/dev/null 2>&1 || true
  docker exec "$two" docker run -d --name "srv-$net" --network "cost-$net" "$IMAGE" python3 -c "$SERVER" >/dev/null
done

declare -A results=([plain]="" [encrypted]="")
for round in $(seq 1 "$ROUNDS"); do
  for net in plain encrypted; do
    gbit=$(docker exec "$one" docker run --rm --network "cost-$net" "$IMAGE" python3 -c "$CLIENT" "srv-$net" "$SECONDS_PER")
    say "round $round $net: $gbit Gbit/s"
    results[$net]+="$gbit "
  done
done
for net in plain encrypted; do
  docker exec "$two" docker rm -f "srv-$net" >/dev/null
  docker exec "$one" docker network rm "cost-$net" >/dev/null
done
python3 - "${results[plain]}" "${results[encrypted]}" "$(cat /proc/loadavg)" <<'EOF'
import statistics, sys
plain, enc = ([float(x) for x in a.split()] for a in sys.argv[1:3])
for name, xs in (("plain", plain), ("encrypted", enc)):
    print(f"{name:9}  min {min(xs):.3f}  median {statistics.median(xs):.3f}  max {max(xs):.3f} Gbit/s")
print(f"encrypted / plain (medians): {statistics.median(enc) / statistics.median(plain):.2f}x; load {sys.argv[3]}")
EOF
