#!/usr/bin/env bash
# `make resize WORKERS=N`: the running job saves at the next step boundary, every task stops, and the
# job starts again with N workers from that checkpoint, with the knobs of its `make up`.
# Refusals first, one line each: compose/resize.py's (the count, the job's state), then make up's own
# for the new size (compose/up.sh --check), all before any task stops. Stopping is SIGTERM to every task: the preemption
# handler makes all of them save the same step and exit (0 steps lost); compose/up.sh then starts the
# new size, and its checkpoint check prints the one line saying what changed (trainer/state/resize.py).
set -euo pipefail
eval "$("${PYTHON:-python3}" -m contract --shell)"
RUN_DIR=${RUN_DIR:-.run}
project=${PROJECT:-$DEFAULT_PROJECT}
say() { echo "resize: $*" >&2; }
if [ ! -f "$RUN_DIR/stack.env" ]; then
  say "PROJECT=$project has no stack: make up WORKERS=N starts one"
  exit 2
fi
run=$(sed -n 's/^RUN=//p' "$RUN_DIR/stack.env")
bind=$(sed -n 's/^BIND_ADDR=//p' "$RUN_DIR/stack.env"); [ "${bind:-0.0.0.0}" = 0.0.0.0 ] && bind=127.0.0.1
"${PYTHON:-python3}" -m compose.resize --project "$project" --workers "${WORKERS:-}" \
  --prometheus "http://$bind:$PROMETHEUS_PORT" --run "$run"
# The knobs of the job's `make up` (compose/up.sh recorded them), under those given now (WORKERS, RESIZE_KEEP=).
declare -A now
for name in ${MAKE_COMMAND_LINE:-}; do now[$name]=${!name:-}; done
set -a
# shellcheck disable=SC1091
. "$RUN_DIR/knobs.env"
set +a
for name in "${!now[@]}"; do export "$name=${now[$name]}"; done
export MAKE_COMMAND_LINE="$UP_KNOBS ${MAKE_COMMAND_LINE:-}"
# make up's own refusals for the new size (memory, GPUs per worker, every knob), before any task stops.
compose/up.sh --check
# shellcheck disable=SC2046  # compose.args is a list of -f options
dc() { docker compose -p "$project" --project-directory . --env-file "$RUN_DIR/stack.env" $(cat "$RUN_DIR/compose.args") "$@"; }
say "stopping every task at the next step boundary (each saves the same step)"
# shellcheck disable=SC2046  # a list of service names
dc stop -t 60 $(dc config --services | grep -xE 'chief|worker-[0-9]+')
compose/up.sh
