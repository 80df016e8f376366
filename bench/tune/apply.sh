#!/usr/bin/env bash
# `make tune APPLY=1`, once the winner is in RUN_DIR/tuned.env: every task saves the same step and stops
# (SIGTERM: the preemption handler, as make resize does), then compose/up.sh starts the job again with
# the knobs of its own `make up` (RUN_DIR/knobs.env, which up.sh recorded), less the winner's names:
# up.sh then takes those from tuned.env and says so, with how to undo it. A knob the job was started
# with (make up INPUT_DELAY_MS=28) would otherwise win over the file, and the job restart as it was.
# Environment: RUN_DIR, PROJECT, WORKERS (the job's size), PYTHON (bench/tune/__main__.py sets them).
set -euo pipefail
say() { echo "tune: $*" >&2; }

# The job's own knobs exported, the winner's names unset and off MAKE_COMMAND_LINE (tests source this).
winner_over_knobs() {
  local knobs=$1 tuned=$2 size=$WORKERS name keep
  set -a
  # shellcheck disable=SC1090
  . "$knobs"
  set +a
  export WORKERS=$size
  keep=" $UP_KNOBS "
  while IFS='=' read -r name _; do
    [[ $name =~ ^[A-Z][A-Z0-9_]*$ ]] || continue
    unset "$name" "TRAINER_$name"
    keep=${keep// $name / }
  done <"$tuned"
  export MAKE_COMMAND_LINE="$keep"
}

main() {
  local knobs="$RUN_DIR/knobs.env" tuned="$RUN_DIR/tuned.env"
  if [ ! -f "$knobs" ] || [ ! -f "$tuned" ]; then
    say "cannot apply: $knobs or $tuned is missing: make down PROJECT=$PROJECT, then make up with the same settings"
    exit 2
  fi
  winner_over_knobs "$knobs" "$tuned"
  export PROJECT
  # make up's own refusals (memory, GPUs, every knob with the winner) before any task stops.
  compose/up.sh --check
  # shellcheck disable=SC2046  # compose.args is a list of -f options
  dc() { docker compose -p "$PROJECT" --project-directory . --env-file "$RUN_DIR/stack.env" $(cat "$RUN_DIR/compose.args") "$@"; }
  say "stopping every task at the next step boundary (each saves the same step), then make up with the winner"
  # shellcheck disable=SC2046  # a list of service names
  dc stop -t 60 $(dc config --services | grep -xE 'chief|worker-[0-9]+')
  compose/up.sh
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then main; fi
