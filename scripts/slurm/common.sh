# Shared by the sbatch scripts in this folder (sourced; not a job script).
#
# sbatch runs a copy of the job script from its spool directory, so the
# scripts find this file (and the moerl tree) through MOERL_ROOT, not $0.
#
# Every knob is an environment variable, read at the job's start (sbatch
# passes the submitter's environment: `MOERL_CONFIG=... sbatch single_node.sbatch`):
#   MOERL_ROOT        the moerl checkout (default: the directory sbatch was run from)
#   MOERL_BIN         the binary (default: $MOERL_ROOT/build/moerl)
#   MOERL_CONFIG      the TOML config (default: $MOERL_ROOT/configs/quickstart.toml)
#   MOERL_INIT        the policy to start from (`moerl pretrain`'s output); empty: none
#   MOERL_RUN_ROOT    where runs live: on storage every node sees, since
#                     learner 0 writes checkpoints there and the requeued job,
#                     maybe on other nodes, resumes from them (default: $MOERL_ROOT/runs)
#   MOERL_RUN_NAME    the run's directory under MOERL_RUN_ROOT (default: the job
#                     name). A requeued job keeps it, so it resumes its own checkpoints.
#   MOERL_ARGS        more moerl train options, split on blanks (e.g. "--set optim.total_steps=400");
#                     they come last, so they win over the options above
#   MOERL_REQUEUE_ON_STOP  1 (default): after a stop by signal (the time-limit
#                     warning), requeue this job so it continues; 0: just end
set -uo pipefail

MOERL_ROOT="${MOERL_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}"
MOERL_BIN="${MOERL_BIN:-$MOERL_ROOT/build/moerl}"
MOERL_CONFIG="${MOERL_CONFIG:-$MOERL_ROOT/configs/quickstart.toml}"
MOERL_INIT="${MOERL_INIT:-}"
MOERL_RUN_ROOT="${MOERL_RUN_ROOT:-$MOERL_ROOT/runs}"
MOERL_RUN_NAME="${MOERL_RUN_NAME:-${SLURM_JOB_NAME:-moerl}}"
MOERL_ARGS="${MOERL_ARGS:-}"
MOERL_REQUEUE_ON_STOP="${MOERL_REQUEUE_ON_STOP:-1}"

[ -x "$MOERL_BIN" ] || { echo "moerl-slurm: no moerl binary at $MOERL_BIN (set MOERL_ROOT or MOERL_BIN)" >&2; exit 2; }
[ -f "$MOERL_CONFIG" ] || { echo "moerl-slurm: no config at $MOERL_CONFIG (set MOERL_CONFIG)" >&2; exit 2; }
[ -z "$MOERL_INIT" ] || [ -f "$MOERL_INIT" ] || { echo "moerl-slurm: no init checkpoint at $MOERL_INIT" >&2; exit 2; }

read -r -a moerl_extra <<<"$MOERL_ARGS"
# `--resume auto` on every attempt: the first one starts fresh (no checkpoint
# yet, moerl says so), a requeued one continues from the newest valid version.
# --init only matters while there is no checkpoint.
moerl_train_args=(train --config "$MOERL_CONFIG" --set run.output_dir="$MOERL_RUN_ROOT" --set run.name="$MOERL_RUN_NAME"
                  --resume auto)
[ -n "$MOERL_INIT" ] && moerl_train_args+=(--init "$MOERL_INIT")
moerl_train_args+=("${moerl_extra[@]}")

# Root can run MPI jobs only when it says so (containers, test clusters).
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

MOERL_RUN_DIR="$MOERL_RUN_ROOT/$MOERL_RUN_NAME"
MOERL_SLURM_LOG_DIR="$MOERL_RUN_DIR/slurm"
mkdir -p "$MOERL_SLURM_LOG_DIR"
# One log per attempt (SLURM_RESTART_COUNT counts the requeues) next to the run,
# besides sbatch's --output: the run's history stays with the run.
MOERL_ATTEMPT="${SLURM_RESTART_COUNT:-0}"
MOERL_ATTEMPT_LOG="$MOERL_SLURM_LOG_DIR/job-${SLURM_JOB_ID:-none}-attempt-$MOERL_ATTEMPT.log"
echo "moerl-slurm: job ${SLURM_JOB_ID:-?} attempt $MOERL_ATTEMPT on $(hostname -s), run $MOERL_RUN_DIR, config $MOERL_CONFIG"

# The stop: Slurm's --signal=B:TERM@N reaches this shell only (B:), N seconds
# before the time limit. moerl_relay_stop (set by the job script) passes it on
# to the ranks, whose learner 0 writes a checkpoint ([checkpoint]
# save_on_stop, on by default) and ends every rank; then this job requeues
# itself so that the next attempt resumes from that checkpoint.
#
# The stop goes to learner 0 alone, by its pid from <run>/ranks/rank-0.json:
# learner 0 turns one signal into a stop of every rank (docs/reliability.md).
# Not through mpirun: inside a Slurm allocation Open MPI 5.0.11's mpirun kills
# its ranks on SIGTERM before learner 0 has written its checkpoint (seen in
# cli.slurm_requeue; outside Slurm it gives them the time). Not through srun:
# srun takes a SIGTERM as "cancel the step" and SIGKILLs the tasks. Learner 0
# runs on the first node of the job (component 0 in a hetjob), where this
# batch shell runs, so a plain kill reaches it.
moerl_signal_learner0() {  # moerl_signal_learner0 SIGNAL: true when learner 0 of this attempt was signalled
  local record="$MOERL_RUN_DIR/ranks/rank-0.json" pid host
  [ -s "$record" ] || return 1
  read -r pid host < <(python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["pid"], r["host"])' "$record" 2>/dev/null)
  [ -n "$pid" ] || return 1
  # A record left by an earlier attempt names a pid that is gone or another
  # program's: only a live moerl on this host is learner 0 of this attempt.
  [ "$host" = "$(hostname)" ] || [ "$host" = "$(hostname -s)" ] || return 1
  [ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$MOERL_BIN")" ] || return 1
  kill -s "$1" "$pid" 2>/dev/null
}

moerl_stop_requested=0
moerl_child=""
moerl_on_stop() {
  [ "$moerl_stop_requested" = 1 ] && return  # one relay: a second TERM means "now" to moerl
  moerl_stop_requested=1
  echo "moerl-slurm: $1 received at $(date +%T); asking moerl to checkpoint and stop"
  moerl_relay_stop "$1"
}
trap 'moerl_on_stop TERM' TERM
trap 'moerl_on_stop INT' INT
trap 'moerl_on_stop USR1' USR1

moerl_run() {  # moerl_run CMD...: runs CMD in the background (so the traps run at once), waits, sets moerl_status
  "$@" > >(tee -a "$MOERL_ATTEMPT_LOG") 2>&1 &
  moerl_child=$!
  # `wait` returns early when a trapped signal arrives: wait again until the child has ended.
  while :; do
    wait "$moerl_child"
    moerl_status=$?
    kill -0 "$moerl_child" 2>/dev/null || break
  done
  echo "moerl-slurm: moerl ended with status $moerl_status"
}

moerl_finish() {  # after moerl_run: requeue after a stop, else end with moerl's status
  sleep 1  # tee writes the last lines of the attempt log
  # A stop that came after the last step left nothing to continue.
  local finished=0
  [ "$moerl_status" = 0 ] && ! grep -q "^stopping after step" "$MOERL_ATTEMPT_LOG" && finished=1
  if [ "$moerl_stop_requested" = 1 ] && [ "$finished" = 0 ] && [ "$MOERL_REQUEUE_ON_STOP" = 1 ] &&
     [ -n "${SLURM_JOB_ID:-}" ]; then
    # Slurm requeues on its own only after a node failure or a preemption, not
    # at the time limit: the job asks for it. It keeps its id, name and run.
    echo "moerl-slurm: requeueing job $SLURM_JOB_ID (attempt $((MOERL_ATTEMPT + 1)) resumes from the checkpoint)"
    if scontrol requeue "$SLURM_JOB_ID"; then exit 0; fi
    echo "moerl-slurm: scontrol requeue failed (is the job --requeue, JobRequeue=1?); resubmit it: it resumes with --resume auto" >&2
  fi
  exit "$moerl_status"
}
