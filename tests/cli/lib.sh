# Shared helpers for the CLI tests. Usage: source lib.sh "$@" (moerl binary, source dir).
set -u
MOERL="$1"
SOURCE_DIR="$2"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
# Multi-rank jobs start through the project's launcher (the MPI moerl was
# built against, the flags this machine needs); no restarts unless a test asks.
LAUNCH=(env MOERL_BIN="$MOERL" "$SOURCE_DIR/scripts/launch.sh" --max-restarts 0)
failures=0

fail() { echo "FAILED: $*"; failures=$((failures + 1)); }
expect_status() {  # expect_status WANT GOT WHAT
  [ "$1" = "$2" ] || fail "$3: exit status $2, expected $1"
}
expect_contains() {  # expect_contains FILE TEXT WHAT
  grep -qF -- "$2" "$1" || { fail "$3: output lacks '$2'"; sed 's/^/    | /' "$1"; }
}
expect_count() {  # expect_count FILE TEXT N WHAT
  local n
  n=$(grep -cF -- "$2" "$1")
  [ "$n" = "$3" ] || { fail "$4: '$2' appears $n times, expected $3"; sed 's/^/    | /' "$1"; }
}
finish() {
  if [ "$failures" -eq 0 ]; then echo "all checks passed"; exit 0; fi
  echo "$failures check(s) failed"; exit 1
}
