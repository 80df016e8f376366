# Sourced by compose/up.sh: `use_tuned FILE` exports make tune's winner (bench/tune/winner.py writes FILE,
# NAME=value lines) as TRAINER_<NAME> for each setting the user did not give (on make's command line, or
# as TRAINER_<NAME>), and says on stderr which it used and how to undo it, unless its second argument is 1
# (up.sh --check, which make tune APPLY=1 runs before the start that says it: the line came twice).
use_tuned() {
  local file=$1 quiet=${2:-0} used="" name value given
  [ -s "$file" ] || return 0
  while IFS='=' read -r name value; do
    [[ $name =~ ^[A-Z][A-Z0-9_]*$ ]] || continue
    given="TRAINER_$name"
    if [ -z "${!name:-}" ] && [ -z "${!given:-}" ]; then
      export "TRAINER_$name=$value"
      used="$used $name=$value"
    fi
  done <"$file"
  if [ -n "$used" ] && [ "$quiet" != 1 ]; then
    echo "up: using make tune's winner from $file:$used (undo: rm $file, or give the setting on the command line)" >&2
  fi
}
