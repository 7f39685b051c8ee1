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
#   MOERL_REQUEUE_ON_STOP  1 (default): after the stop at the time-limit warning
#                     (SIGUSR1), requeue this job so it continues; 0: just end
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

# The stop: Slurm's --signal=B:USR1@N sends SIGUSR1 to this batch shell only
# (B:), N seconds before the time limit. The script passes a SIGTERM on to
# learner 0, which writes a checkpoint ([checkpoint] save_on_stop, on by
# default) and stops every rank; then the job requeues itself, and the next
# attempt resumes from that checkpoint. USR1 and not TERM: Slurm sends TERM
# to every process of the job on scancel, a preemption or a requeue from
# outside, and those must not requeue the job again (each rank gets that
# TERM itself, learner 0 included, so nothing is relayed then either: a
# second TERM tells moerl to leave at once, without its checkpoint).
#
# The stop goes to learner 0 alone, by its pid from <run>/ranks/rank-0.json:
# learner 0 turns one signal into a stop of every rank (docs/reliability.md).
# Not through mpirun: inside a Slurm allocation Open MPI 5.0.11's mpirun kills
# its ranks on SIGTERM before learner 0 has written its checkpoint (seen in
# cli.slurm_requeue; outside Slurm it gives them the time). Not through srun:
# srun takes a SIGTERM as "cancel the step" and SIGKILLs the tasks. Learner 0
# runs on the first node of the job (component 0 in a hetjob), where this
# batch shell runs, so a plain kill reaches it.
moerl_learner0_pid() {  # prints the pid of learner 0 of this attempt when it runs on this host
  local record="$MOERL_RUN_DIR/ranks/rank-0.json" pid host
  [ -s "$record" ] || return 1
  read -r pid host < <(python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["pid"], r["host"])' "$record" 2>/dev/null)
  [ -n "$pid" ] || return 1
  # A record left by an earlier attempt names a pid that is gone or another
  # program's: only a live moerl on this host is learner 0 of this attempt.
  [ "$host" = "$(hostname)" ] || [ "$host" = "$(hostname -s)" ] || return 1
  [ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" = "$(readlink -f "$MOERL_BIN")" ] || return 1
  echo "$pid"
}
moerl_signal_learner0() {  # moerl_signal_learner0 SIGNAL: true when learner 0 of this attempt was signalled
  local pid
  pid=$(moerl_learner0_pid) || return 1
  kill -s "$1" "$pid" 2>/dev/null
}

# The launcher (srun, or mpirun through launch.sh) must end soon after
# learner 0 does: learner 0 leaves last, after every rank has stopped or been
# given up on (cluster.shutdown_timeout_s). One that lingers past
# MOERL_LAUNCHER_GRACE_S (default 60) is killed, so that the job still
# requeues or ends: seen with Slurm 22.05's srun under load, deadlocked at a
# step's end between its signal-forwarding thread (slurm_step_launch_abort)
# and its step-finish path (pmixp_abort_agent_stop), with every task gone.
moerl_reap_lingering_launcher() {  # moerl_reap_lingering_launcher LAUNCHER_PID (run in the background)
  local launcher=$1 grace="${MOERL_LAUNCHER_GRACE_S:-60}" learner0="" waited=0
  while kill -0 "$launcher" 2>/dev/null && [ -z "$learner0" ]; do
    learner0=$(moerl_learner0_pid) || learner0=""
    sleep 1
  done
  [ -n "$learner0" ] || return 0
  while kill -0 "$learner0" 2>/dev/null; do sleep 1; done
  while kill -0 "$launcher" 2>/dev/null; do
    if [ "$waited" -ge "$grace" ]; then
      echo "moerl-slurm: learner 0 (pid $learner0) has ended but the launcher (pid $launcher) has not, $grace s later; killing it" >&2
      pkill -KILL -P "$launcher" 2>/dev/null
      kill -KILL "$launcher" 2>/dev/null
      return 0
    fi
    sleep 1
    waited=$((waited + 1))
  done
}

moerl_stop_requested=0  # 1: the time-limit warning came, requeue after the stop
moerl_ending=0          # 1: Slurm is ending the job (TERM/INT): no requeue
moerl_child=""
moerl_on_warning() {
  [ "$moerl_stop_requested" = 1 ] && return  # one relay: a second TERM means "now" to moerl
  moerl_stop_requested=1
  echo "moerl-slurm: SIG$1 (the time-limit warning) at $(date +%T); asking learner 0 to checkpoint and stop"
  moerl_relay_stop TERM
}
moerl_on_end() {
  moerl_ending=1
  echo "moerl-slurm: SIG$1 at $(date +%T): the job is being ended (scancel, preemption or requeue); no requeue from here"
}
trap 'moerl_on_warning USR1' USR1
trap 'moerl_on_end TERM' TERM
trap 'moerl_on_end INT' INT

moerl_run() {  # moerl_run CMD...: runs CMD in the background (so the traps run at once), waits, sets moerl_status
  "$@" > >(tee -a "$MOERL_ATTEMPT_LOG") 2>&1 &
  moerl_child=$!
  moerl_reap_lingering_launcher "$moerl_child" &
  local reaper=$!
  # `wait` returns early when a trapped signal arrives: wait again until the child has ended.
  while :; do
    wait "$moerl_child"
    moerl_status=$?
    kill -0 "$moerl_child" 2>/dev/null || break
  done
  kill "$reaper" 2>/dev/null
  wait "$reaper" 2>/dev/null
  echo "moerl-slurm: moerl ended with status $moerl_status"
}

moerl_finish() {  # after moerl_run: requeue after a stop, else end with moerl's status
  sleep 1  # tee writes the last lines of the attempt log
  # A stop that came after the last step left nothing to continue.
  local finished=0
  [ "$moerl_status" = 0 ] && ! grep -q "^stopping after step" "$MOERL_ATTEMPT_LOG" && finished=1
  if [ "$moerl_stop_requested" = 1 ] && [ "$moerl_ending" = 0 ] && [ "$finished" = 0 ] && [ "$MOERL_REQUEUE_ON_STOP" = 1 ] &&
     [ -n "${SLURM_JOB_ID:-}" ]; then
    # Slurm requeues on its own only after a node failure or a preemption, not
    # at the time limit: the job asks for it. It keeps its id, name and run.
    echo "moerl-slurm: requeueing job $SLURM_JOB_ID (attempt $((MOERL_ATTEMPT + 1)) resumes from the checkpoint)"
    if scontrol requeue "$SLURM_JOB_ID"; then exit 0; fi
    echo "moerl-slurm: scontrol requeue failed (is the job --requeue, JobRequeue=1?); resubmit it: it resumes with --resume auto" >&2
  fi
  exit "$moerl_status"
}

# Direct launch by srun (hetjob, and multi_node with MOERL_LAUNCHER=srun).
# The Open MPI 5 wheel in .mpi carries its own PMIx client, and Slurm's
# mpi/pmix plugin serves it: `srun --mpi=pmix` starts the ranks with no
# mpirun, one MPI_COMM_WORLD across every task (and across the components
# of a hetjob), checked by cli.slurm_jobs. Such a job has no ULFM: Open MPI's
# fault tolerance needs its own runtime (mpirun --with-ft ulfm), so a lost
# rank stops the job (status 4, checkpoint saved when learner 0 lives) and
# moerl_srun_loop starts it again from that checkpoint, as launch.sh does
# for mpirun.
MOERL_MAX_RESTARTS="${MOERL_MAX_RESTARTS:-3}"
moerl_srun_loop() {  # moerl_srun_loop SRUN_ARGS... -- ; the moerl args come from moerl_train_args
  export MOERL_FAULT_TOLERANCE=off
  local attempt=0
  while :; do
    export MOERL_RESTARTS="$attempt"
    moerl_run "$@"
    case "$moerl_status" in 0|2) return ;; esac  # done, or a configuration error (the same on every try)
    [ "$moerl_stop_requested" = 1 ] || [ "$moerl_ending" = 1 ] && return
    [ "$attempt" -ge "$MOERL_MAX_RESTARTS" ] && { echo "moerl-slurm: giving up after $attempt restarts"; return; }
    attempt=$((attempt + 1))
    export MOERL_RESTART_CAUSE="the previous srun ended with status $moerl_status"
    echo "moerl-slurm: srun ended with status $moerl_status; restart $attempt of $MOERL_MAX_RESTARTS (--resume auto)"
  done
}
# srun passes a SIGTERM it gets as a cancel of the step (SIGKILL soon after),
# so the fallback before learner 0 has started asks Slurm to signal the
# steps' tasks instead: each rank then stops by itself.
moerl_relay_stop_srun() {
  moerl_signal_learner0 "$1" || scancel --signal="$1" "$SLURM_JOB_ID" 2>/dev/null
}
