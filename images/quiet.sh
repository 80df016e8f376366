#!/usr/bin/env bash
# One line per set-up step; the step's own output (pip, mmdebstrap, the image builder) goes to a log.
#   images/quiet.sh LOG WHAT CMD [ARGS...]     run CMD with its output in LOG, printing
#       WHAT ... ok (12 s; log: LOG)
#   or, when it fails, "FAILED (exit N; log: LOG)", the log's last QUIET_TAIL (30) lines, and exit N.
# Sourced (`. images/quiet.sh`), it defines `quietly LOG WHAT CMD...`, where CMD may be a shell function.
# QUIET=0 shows the output as before (and still writes LOG).

quietly() {
  local log=$1 what=$2 start rc=0
  shift 2
  mkdir -p "$(dirname "$log")"
  start=$(date +%s)
  if [ "${QUIET:-1}" = 0 ]; then
    echo "$what (log: $log)" >&2
    "$@" 2>&1 | tee "$log" >&2 || rc=${PIPESTATUS[0]}
    return "$rc"
  fi
  printf '%s ... ' "$what" >&2
  "$@" >"$log" 2>&1 </dev/null || rc=$?
  if [ "$rc" = 0 ]; then
    printf 'ok (%s s; log: %s)\n' "$(($(date +%s) - start))" "$log" >&2
    return 0
  fi
  printf 'FAILED (exit %s; log: %s); its last lines:\n' "$rc" "$log" >&2
  tail -n "${QUIET_TAIL:-30}" "$log" | sed 's/^/  | /' >&2
  return "$rc"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -uo pipefail
  [ $# -ge 3 ] || { echo "usage: $0 LOG WHAT CMD [ARGS...]" >&2; exit 2; }
  quietly "$@"
fi
