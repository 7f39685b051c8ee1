#!/usr/bin/env bash
# The first command: set up, build, run the default job on this machine.
# Until the RL loop lands this is the launch check (--dry-run): every role
# starts, the ranks exchange messages, learner 0 prints the plan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh --target moerl
CONFIG="${1:-configs/quickstart.toml}"
RANKS=$(build/moerl config show "$CONFIG" | awk -F' *= *' '
  /^\[cluster\]/ {c=1; next} /^\[/ {c=0}
  c && $1 ~ /^(learners|actors|env_workers|standby_actors)$/ {n += $2} END {print n}')
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One compute thread per rank: ranks outnumber this machine's cores.
export OMP_NUM_THREADS=1 MOERL_THREADS_PER_RANK=1
echo "quickstart: mpirun -np $RANKS build/moerl train --config $CONFIG --dry-run"
mpirun -np "$RANKS" --oversubscribe build/moerl train --config "$CONFIG" --dry-run
