#!/usr/bin/env bash
# The first command: set up, build, then post-train a small MoE policy on this
# machine: pretrain a base on scripted-expert demonstrations, run RL with
# learners, actors and env workers (scripts/launch.sh: the fault-tolerant MPI
# that setup installed, restarts on a lost rank), and print the before/after
# evaluation on held-out seeds (also <run dir>/summary.json), and write the
# report with plots (<run dir>/report/index.html, moerl report).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh --target moerl
# Usage: scripts/quickstart.sh [CONFIG] [--set section.key=value ...]
CONFIG=configs/quickstart.toml
if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then CONFIG="$1"; shift; fi
RUN_DIR=$(build/moerl config get "$CONFIG" run.directory "$@")
RANKS=$(build/moerl config get "$CONFIG" cluster.ranks "$@")
start=$(date +%s)

echo "== 1/2 pretraining the base policy on expert demonstrations"
build/moerl pretrain --config "$CONFIG" "$@"

echo "== 2/2 RL post-training: scripts/launch.sh -n $RANKS train (learners, actors, env workers)"
# One compute thread per rank: ranks outnumber this machine's cores.
export OMP_NUM_THREADS=1 MOERL_THREADS_PER_RANK=1
scripts/launch.sh -n "$RANKS" train --config "$CONFIG" "$@" --init "$RUN_DIR/base.pt"
echo "quickstart: done in $(( $(date +%s) - start )) s; results in $RUN_DIR (summary.json, metrics)"
# The page with the plots and the before/after table (moerl report also works mid-run).
if build/moerl report "$RUN_DIR"; then
  echo "quickstart: the report is $(cd "$RUN_DIR" && pwd)/report/index.html (open it in a browser)"
else
  echo "quickstart: no report (see above); the results are in $RUN_DIR" >&2
fi
