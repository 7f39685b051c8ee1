#!/usr/bin/env bash
# One-command rollback of a run to its previous good checkpoint: moves
# RUN_DIR/checkpoints/latest to the newest valid (fully verified) version older
# than the current one. A running job's learner notices at its next step, loads
# that version's weights and optimizer state and publishes them to the actors
# as a new policy version; `moerl train --resume auto` resumes from it.
#
# Usage: scripts/rollback.sh RUN_DIR
#   MOERL=/path/to/moerl overrides the binary (default: build/moerl, or
#   $MOERL_BUILD_DIR/moerl). Extra arguments go to `moerl checkpoint rollback`
#   in place of --previous (e.g. --to good).
set -euo pipefail
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
RUN_DIR="$1"
shift
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MOERL="${MOERL:-$ROOT/${MOERL_BUILD_DIR:-build}/moerl}"
if [ ! -x "$MOERL" ]; then
  echo "rollback.sh: moerl binary '$MOERL' not found; build it with scripts/build.sh or set MOERL" >&2
  exit 2
fi
CKPT="$RUN_DIR/checkpoints"
if [ ! -d "$CKPT" ]; then
  echo "rollback.sh: '$CKPT' does not exist (is '$RUN_DIR' a run directory?)" >&2
  exit 2
fi
if [ $# -eq 0 ]; then set -- --previous; fi
"$MOERL" checkpoint rollback "$CKPT" "$@"
echo "now:"
"$MOERL" checkpoint list "$CKPT"
