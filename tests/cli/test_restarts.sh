# Losses the job cannot survive in place end it cleanly with a status that
# scripts/launch.sh restarts from the last checkpoint (docs/reliability.md),
# with faults injected from outside (a real SIGKILL or SIGSTOP):
#   - the only env worker frozen (SIGSTOP): declared lost after
#     heartbeat_timeout_s, fenced, the job stops with status 4 and the
#     restart finishes it;
#   - learner 0 SIGKILLed: the others find it silent, end with status 4, and
#     the restart finishes the job;
#   - without fault tolerance (launch.sh --no-ft) a SIGKILLed actor ends the
#     whole job, and the restart finishes it;
#   - a fault that comes back on every attempt is a crash loop: launch.sh
#     gives up after --crash-loop short attempts;
#   - a [faults] plan entry strikes the first attempt only.
# Each finished job's summary.json counts the restart and every step.
source "$(dirname "$0")/lib.sh" "$@"
needs_ulfm
pretrain_tiny
STEPS=30
RESTARTING=(env MOERL_BIN="$MOERL" "$SOURCE_DIR/scripts/launch.sh" --max-restarts 1 --min-uptime 5)

start() {  # start NAME [launch.sh options...] -- [train options...]: a STEPS-step job in the background; sets $job
  local name=$1 launch_opts=()
  shift
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do launch_opts+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  "${RESTARTING[@]}" "${launch_opts[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" --set run.name="$name" \
    --set optim.total_steps=$STEPS --set cluster.heartbeat_timeout_s=5 --set checkpoint.every_steps=5 \
    --init "$TINY_BASE" "$@" >"$name.txt" 2>&1 &
  job=$!
}
restarted_and_finished() {  # restarted_and_finished NAME WANT_FIRST_STATUS
  wait_job "$job" 240 "$1"
  local status=$?
  expect_status 0 $status "$1: exit status after the restart"
  expect_contains "$1.txt" "the job ended with exit status $2 after" "$1: the first attempt's status"
  expect_contains "$1.txt" "restart 1 of 1 with --resume auto" "$1: one restart"
  expect_contains "$1.txt" "resumed from" "$1: the restart resumed from a checkpoint"
  expect_contains "$1.txt" "step $STEPS/$STEPS " "$1: every step"
  python3 - "$WORK/runs/$1/summary.json" "$2" <<'PY' || fail "$1: summary.json"
import json, sys
s = json.load(open(sys.argv[1]))
print(sys.argv[1], "restarts", s["restarts"], "failures", s["failures"])
assert s["restarts"] == 1 and s["steps"] == 30 and s["steps_completed"] == 30, s
restarts = [x for x in s["failures"] if x["kind"].startswith("restart 1 by scripts/launch.sh")]
assert len(restarts) == 1 and ("exit status %s" % sys.argv[2]) in restarts[0]["kind"], s["failures"]
PY
}

# 1. The only env worker frozen.
start freeze_env --
hit freeze_env 3 STOP 3
frozen=$hit_pid
restarted_and_finished freeze_env 4
expect_contains freeze_env.txt "rank 3 (env_worker 0 on host" "freeze_env: the frozen rank named"
expect_contains freeze_env.txt "no env worker is left" "freeze_env: why the job stopped"
if [ -n "$frozen" ] && kill -0 "$frozen" 2>/dev/null; then
  fail "freeze_env: the frozen process $frozen was not fenced"
  kill -9 "$frozen"
fi
python3 -c "
import json, sys
f = json.load(open(sys.argv[1]))['failures']
assert any(x['rank'] == 3 and x['role'] == 'env_worker' and 5 <= x['detected_after_s'] < 8 for x in f), f
" "$WORK/runs/freeze_env/summary.json" || fail "freeze_env: the lost env worker in summary.json failures"

# 2. Learner 0 SIGKILLed.
start kill_learner --
hit kill_learner 0 KILL 8
restarted_and_finished kill_learner 4
expect_contains kill_learner.txt "learner 0" "kill_learner: learner 0 named"

# 3. No fault tolerance: a SIGKILLed actor ends the job, the restart finishes it.
start no_ft --no-ft --
hit no_ft 1 KILL 3
wait_job "$job" 240 no_ft
expect_status 0 $? "no_ft: exit status after the restart"
expect_contains no_ft.txt "restart 1 of 1 with --resume auto" "no_ft: one restart"
expect_contains no_ft.txt "step $STEPS/$STEPS " "no_ft: every step"
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); assert s['restarts'] == 1 and s['steps'] == 30, s" \
  "$WORK/runs/no_ft/summary.json" || fail "no_ft: summary.json counts the restart"

# 4. A crash loop: learner 0 is killed 2 s into every attempt.
"${RESTARTING[@]}" --max-restarts 5 --crash-loop 2 --min-uptime 120 -n 4 train --config "$CONFIG" "${TINY[@]}" \
  --set run.name=loop --set optim.total_steps=1000 --set cluster.heartbeat_timeout_s=5 \
  --set 'faults.plan=["kill learner 0 at 2 s on every attempt"]' --init "$TINY_BASE" >loop.txt 2>&1 &
job=$!
wait_job "$job" 120 loop
status=$?
[ "$status" != 0 ] || fail "loop: a crash loop ends in a failure status"
expect_contains loop.txt "2 attempts in a row ended within 120 s" "loop: launch.sh names the crash loop"
expect_count loop.txt "restart 1 of 5" 1 "loop: one restart"
expect_count loop.txt "restart 2 of 5" 0 "loop: no second restart"

# 5. A fault of the plan strikes the first attempt only: the restart goes past it.
start plan_once -- --set 'faults.plan=["kill learner 0 at step 8"]'
restarted_and_finished plan_once 4
expect_count plan_once.txt "[faults] plan: kill learner 0 at step 8" 1 "plan_once: the fault fired once"
finish
