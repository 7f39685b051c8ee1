#!/usr/bin/env bash
# The one way to start a multi-rank moerl job on one machine or a cluster
# allocation:
#
#   scripts/launch.sh -n RANKS [options] [--] <moerl subcommand and its options>
#   scripts/launch.sh -n 4 train --config configs/quickstart.toml --init runs/quickstart/base.pt
#
# It runs the moerl binary (MOERL_BIN, else $MOERL_BUILD_DIR/moerl, else
# build/moerl) under the MPI launcher it was built against (`moerl --mpiexec`),
# with the flags this machine needs: --oversubscribe and one compute thread per
# rank when the ranks outnumber the cores, --allow-run-as-root as root, and
# --with-ft ulfm when that MPI is fault tolerant (then a lost actor or env
# worker does not end the job).
#
# It supervises `train` like torchrun's max_restarts: when the job ends in a
# failure (any exit status but 0, 2 = configuration error, or a stop asked
# for by a signal to this script), it starts the job again with
# `--resume auto`, so that it continues from its last checkpoint, at most
# --max-restarts times; it gives up early on a crash loop (--crash-loop
# attempts in a row that each lasted under --min-uptime seconds). The
# attempt number reaches moerl as MOERL_RESTARTS (summary.json `restarts`) and
# the cause of the last restart as MOERL_RESTART_CAUSE.
#
# Options:
#   -n, --ranks N        ranks (required; `moerl config get CONFIG cluster.ranks` tells a config's count)
#   --max-restarts K     relaunches of a failed `train` (default 3; 0 = none)
#   --crash-loop K       give up after K short attempts in a row (default 2)
#   --min-uptime S       an attempt shorter than S seconds is short (default 30)
#   --no-ft              do not ask the MPI for fault tolerance: a lost rank ends the job
#                        (as with an MPI without ULFM), then the restart continues it
#   --mpi-arg ARG        one more argument for mpirun (repeatable)
# Environment: MOERL_BIN, MOERL_BUILD_DIR, MOERL_MPIEXEC (another launcher).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

ranks=""
max_restarts=3
crash_loop=2
min_uptime=30
fault_tolerance=1
mpi_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--ranks) ranks="$2"; shift 2 ;;
    --max-restarts) max_restarts="$2"; shift 2 ;;
    --crash-loop) crash_loop="$2"; shift 2 ;;
    --min-uptime) min_uptime="$2"; shift 2 ;;
    --no-ft) fault_tolerance=0; shift ;;
    --mpi-arg) mpi_args+=("$2"); shift 2 ;;
    --) shift; break ;;
    -*) echo "launch.sh: unknown option $1 (see the top of scripts/launch.sh)" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ -z "$ranks" ] || [ $# -eq 0 ]; then
  echo "usage: scripts/launch.sh -n RANKS [options] [--] <moerl subcommand> [its options]" >&2
  exit 2
fi
case "$ranks" in ''|*[!0-9]*) echo "launch.sh: -n needs a number of ranks, got '$ranks'" >&2; exit 2 ;; esac

MOERL_BIN="${MOERL_BIN:-$ROOT/${MOERL_BUILD_DIR:-build}/moerl}"
case "$MOERL_BIN" in /*) ;; *) MOERL_BIN="$PWD/$MOERL_BIN" ;; esac
[ -x "$MOERL_BIN" ] || { echo "launch.sh: no moerl binary at $MOERL_BIN (run scripts/build.sh)" >&2; exit 2; }
MPIEXEC="${MOERL_MPIEXEC:-$("$MOERL_BIN" --mpiexec)}"
command -v "$MPIEXEC" >/dev/null || { echo "launch.sh: the MPI launcher '$MPIEXEC' is missing" >&2; exit 2; }

launcher=("$MPIEXEC" -np "$ranks")
[ "$(id -u)" -eq 0 ] && launcher+=(--allow-run-as-root) && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [ "$ranks" -gt "$(nproc)" ]; then
  launcher+=(--oversubscribe)
  # Ranks outnumber the cores: one compute thread each (unless told otherwise).
  export MOERL_THREADS_PER_RANK="${MOERL_THREADS_PER_RANK:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
"$MPIEXEC" --version 2>/dev/null | grep -q "Open MPI.* 5\|prterun\|(Open MPI) 5" && open_mpi_5=1 || open_mpi_5=0
if [ "$fault_tolerance" = 1 ] && "$MOERL_BIN" --version | grep -q "with ULFM" && [ "$open_mpi_5" = 1 ]; then
  launcher+=(--with-ft ulfm)
  export MOERL_FAULT_TOLERANCE=ulfm
else
  export MOERL_FAULT_TOLERANCE=off
fi
launcher+=("${mpi_args[@]}")

# Only a real `train` resumes; other subcommands and --dry-run run once.
[ "$1" = "train" ] || max_restarts=0
for a in "$@"; do [ "$a" = "--dry-run" ] && max_restarts=0; done
args=("$@")

child=""
stopped_by_signal=0
on_signal() {
  stopped_by_signal=1
  [ -n "$child" ] && kill -s "$1" "$child" 2>/dev/null
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
status_dir=""
trap '[ -n "$status_dir" ] && rm -rf "$status_dir"' EXIT

ORPHAN_GRACE_S=${MOERL_LAUNCHER_ORPHAN_GRACE_S:-15}  # the variable is for tests
# recorded_status DIR: the job's status from its ranks' records (see the loop below).
recorded_status() {
  local records
  records=$(cat "$1"/*.status 2>/dev/null)
  if [ "$(printf '%s\n' "$records" | grep -c '^[0-9]')" -lt "$ranks" ]; then echo 4; return; fi
  local failing
  failing=$(printf '%s\n' "$records" | grep -v '^0$' | sort | uniq -c | sort -k1,1nr -k2,2nr | awk 'NR == 1 {print $2}')
  echo "${failing:-0}"
}
attempt=0
short_in_a_row=0
while :; do
  export MOERL_RESTARTS="$attempt"
  # Each rank writes its exit status here (runtime/exit_record.h): the job's
  # status when mpirun has to be ended below.
  status_dir=$(mktemp -d "${TMPDIR:-/tmp}/moerl-exit.XXXXXX")
  export MOERL_EXIT_STATUS_DIR="$status_dir"
  started=$(date +%s)
  "${launcher[@]}" "$MOERL_BIN" "${args[@]}" &
  child=$!
  # Open MPI 5.0.11's mpirun could stay up after every local rank had ended
  # through MPI_Abort ("Abort is in progress", seen under load in cli.train
  # and cli.restarts; in cli.resume with its main thread deadlocked on a
  # mutex, never reaping a rank that had exited): once ranks were seen and
  # none is left running (an exited rank it did not reap, a zombie, is not
  # running) for $ORPHAN_GRACE_S s, it is ended. The attempt's status is then
  # the one its ranks recorded (the most common non-zero one, or 0 when every
  # rank ended with 0); without a record from every rank it counts as a lost
  # rank (status 4), which restarts from the last checkpoint.
  ranks_seen=0
  orphaned_since=""
  hung=0
  while kill -0 "$child" 2>/dev/null; do
    if ps -o stat= --ppid "$child" 2>/dev/null | grep -qv '^Z'; then
      ranks_seen=1
      orphaned_since=""
    elif [ "$ranks_seen" = 1 ]; then
      [ -z "$orphaned_since" ] && orphaned_since=$(date +%s)
      if [ $(( $(date +%s) - orphaned_since )) -ge "$ORPHAN_GRACE_S" ]; then
        echo "launch.sh: mpirun (pid $child) still running $ORPHAN_GRACE_S s after its last rank ended; stopping it" >&2
        kill -KILL "$child" 2>/dev/null
        hung=1
      fi
    fi
    sleep 1
  done
  # `wait` returns early when a trapped signal arrives; wait again for the job's own end.
  while :; do
    wait "$child"
    status=$?
    kill -0 "$child" 2>/dev/null || break
  done
  if [ "$hung" = 1 ]; then
    status=$(recorded_status "$status_dir")
    echo "launch.sh: the ranks' recorded exit status: $status" >&2
  fi
  rm -rf "$status_dir"
  child=""
  lasted=$(( $(date +%s) - started ))
  case "$status" in
    0) exit 0 ;;
    2) exit 2 ;;  # a configuration error: the same again on every restart
  esac
  if [ "$stopped_by_signal" = 1 ]; then exit "$status"; fi
  if [ "$attempt" -ge "$max_restarts" ]; then
    [ "$max_restarts" -gt 0 ] && echo "launch.sh: the job failed (exit status $status) after $attempt restarts (--max-restarts $max_restarts); giving up" >&2
    exit "$status"
  fi
  if [ "$lasted" -lt "$min_uptime" ]; then short_in_a_row=$((short_in_a_row + 1)); else short_in_a_row=0; fi
  if [ "$short_in_a_row" -ge "$crash_loop" ]; then
    echo "launch.sh: $short_in_a_row attempts in a row ended within $min_uptime s (exit status $status): a crash loop; giving up" >&2
    exit "$status"
  fi
  attempt=$((attempt + 1))
  export MOERL_RESTART_CAUSE="the previous attempt ended with exit status $status after $lasted s"
  echo "launch.sh: the job ended with exit status $status after $lasted s; restart $attempt of $max_restarts with --resume auto" >&2
  # Resume from the last checkpoint (replacing any --resume the first attempt had).
  resumed=()
  skip=0
  for a in "${args[@]}"; do
    if [ "$skip" = 1 ]; then skip=0; continue; fi
    case "$a" in --resume) skip=1; continue ;; --resume=*) continue ;; esac
    resumed+=("$a")
  done
  args=("${resumed[@]}" --resume auto)
done
