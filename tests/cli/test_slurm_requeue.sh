# Time-limit stop and requeue under a real Slurm (slurm_lib.sh). A job gets
# the warning that --signal=B:USR1@120 sends before its time limit (here sent
# at once with scancel --signal=USR1 --batch); the script has learner 0 write
# a checkpoint and stop, and requeues the job; the requeued job resumes from
# that version and finishes every step. For the single-node script (launch.sh,
# mpirun) and the hetjob (srun --mpi=pmix). Then: a plain scancel (TERM to
# the whole job) ends a job for good, with no requeue.
source "$(dirname "$0")/lib.sh" "$@"
source "$(dirname "$0")/slurm_lib.sh"
slurm_start
pretrain_tiny
# 400 steps: the stop warning must land while the job still runs; once
# rollouts got faster, 120 tiny steps took 4 s and the hetjob finished before
# its warning arrived (not requeued, in a clean clone).
STEPS=400
# checkpoint.every_steps past the end: the only versions are the one at the
# stop and the final one, so the resume can come only from the stop's.
JOB_ARGS="--set checkpoint.every_steps=100000"

requeue_case() {  # requeue_case NAME SCRIPT [sbatch options]
  local name=$1 job out run="$WORK/runs/$1"
  job=$(slurm_submit_moerl "$@")
  [ -n "$job" ] || { fail "$name: not submitted"; return; }
  out="$WORK/out/$name-$job.out"
  local log0="$run/slurm/job-$job-attempt-0.log" log1="$run/slurm/job-$job-attempt-1.log"
  wait_for_line "$log0" "step 5/$STEPS " 90 || { fail "$name (job $job): step 5 never came"; slurm_logs "$out"; return; }
  scancel --signal=USR1 --batch "$job" || fail "$name: scancel --signal=USR1 --batch"
  # The script requeues the job: back to PENDING, Restarts=1.
  if ! slurm_wait_state "$job" 60 PENDING; then fail "$name (job $job): not requeued"; slurm_logs "$out" "$log0"; return; fi
  [ "$(slurm_job_field "$job" Restarts)" = 1 ] || fail "$name: Restarts=$(slurm_job_field "$job" Restarts), expected 1"
  # Slurm holds a requeued job for about 2 minutes (BeginTime); start it now,
  # but only once the node has cleaned up after attempt 0 (a start while it
  # is still completing failed the job: FAILED, exit code 1:0).
  local deadline=$((SECONDS + 60))
  while [ $SECONDS -lt $deadline ] && [ -n "$(sinfo -h -N -t completing -o %N)" ]; do sleep 1; done
  sleep 2
  scontrol update JobId="$job" StartTime=now || fail "$name: scontrol update StartTime=now"
  if ! slurm_wait_state "$job" 240 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL; then
    fail "$name (job $job): the requeued job did not end within 240 s"; slurm_logs "$out" "$log1"; return
  fi
  local state code
  state=$(slurm_job_field "$job" JobState)
  code=$(slurm_job_field "$job" ExitCode)
  echo "job $name ($job): $state, exit code $code after one requeue"
  [ "$state" = COMPLETED ] && [ "$code" = 0:0 ] || { fail "$name: $state, exit code $code"; slurm_logs "$out" "$log1"; }
  # Attempt 0 stopped on the signal and saved version N; attempt 1 resumed from N.
  local version
  version=$(sed -n 's/^stopping after step \([0-9]*\): signal 15 on rank 0 (checkpoint saved)$/\1/p' "$log0")
  [ -n "$version" ] || { fail "$name: attempt 0 did not stop with a checkpoint"; sed 's/^/    | /' "$log0" | tail -20; return; }
  expect_contains "$log0" "checkpoint version $version saved" "$name: the checkpoint at the stop"
  expect_contains "$out" "requeueing job $job" "$name: the script requeued its job"
  expect_contains "$log1" "resumed from $run/checkpoints version $version (learner step $version)" "$name: resumed from the stop's version"
  expect_contains "$log1" "step $((version + 1))/$STEPS " "$name: attempt 1 continues at the next step"
  expect_contains "$log1" "step $STEPS/$STEPS " "$name: attempt 1 reaches the last step"
  grep -q "^step 1/$STEPS " "$log1" && fail "$name: attempt 1 started again from step 1"
  python3 - "$run" "$STEPS" <<'PY' || fail "$name: summary.json and metrics.jsonl"
import json, sys
run, steps = sys.argv[1], int(sys.argv[2])
s = json.load(open(run + "/summary.json"))
assert s["steps"] == steps, s["steps"]
done = [json.loads(l)["step"] for l in open(run + "/metrics.jsonl")]
assert done == list(range(1, steps + 1)), ("each step once", done[:5], len(done))
print(run, "steps", s["steps"], "metrics lines", len(done))
PY
  echo "$name: stopped at step $version with a checkpoint, requeued, resumed from version $version, finished $STEPS steps"
}

requeue_case single single_node.sbatch --ntasks=4 --overcommit
EXTRA="--set cluster.actors=1 --set cluster.env_workers=1" \
  requeue_case het hetjob.sbatch --ntasks=2 --overcommit : --ntasks=2 --overcommit

# scancel: TERM to every process of the job; the job ends CANCELLED and stays so.
job=$(STEPS=100000 slurm_submit_moerl cancelled single_node.sbatch --ntasks=4 --overcommit)
if [ -n "$job" ] && wait_for_line "$WORK/runs/cancelled/slurm/job-$job-attempt-0.log" "step 2/" 90; then
  scancel "$job"
  slurm_wait_state "$job" 60 CANCELLED || fail "cancelled: not CANCELLED after scancel"
  sleep 5
  state=$(slurm_job_field "$job" JobState)
  [ "$state" = CANCELLED ] && [ "$(slurm_job_field "$job" Restarts)" = 0 ] ||
    fail "cancelled: state $state, Restarts $(slurm_job_field "$job" Restarts) 5 s after scancel (requeued?)"
else
  fail "cancelled: the job did not start"
fi
finish
