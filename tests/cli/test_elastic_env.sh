# Elastic env workers: a SIGTERM to one env worker (a scheduler taking its
# node back) or `moerl ctl release-env RUN_DIR RANK` takes it out of a running
# job; its sessions move to the other env worker, every step completes, no
# session fails, and summary.json counts a release, not a loss. A SIGTERM to
# the whole job still stops it with a checkpoint (no release), and the last
# env worker is not released (the job stops instead). `moerl ctl add-env`
# brings a released and a SIGKILLed env worker back as new processes that
# serve sessions until the job ends.
source "$(dirname "$0")/lib.sh" "$@"
needs_ulfm
pretrain_tiny
# A release takes a few seconds of wall time (the ctl process, learner 0's
# grace, the loss's detection); the tiny job runs about 40 steps a second, so
# its runs are long enough to outlast a release several times over (CI saw
# releases land at step 29-33 of runs that began them at step 2).
STEPS=150

start() {  # start NAME [extra args...]: 1 learner, 2 actors, 2 env workers (ranks 3, 4), in the background
  local name=$1
  shift
  "${LAUNCH[@]}" -n 5 train --config "$CONFIG" "${TINY[@]}" --set cluster.env_workers=2 --set run.name="$name" \
    --set optim.total_steps=$STEPS --set checkpoint.every_steps=4 --init "$TINY_BASE" "$@" >"$name.txt" 2>&1 &
  job=$!
}
show_warnings() {  # show_warnings NAME: the job's warnings, errors and lost sessions, for a failed check
  echo "    the job's warnings, errors and env failures:"
  grep -aE "\[(warning|error)\]|^moerl:|env failures|failed for good" "$1.txt" | tail -n 60 | sed 's/^/    | /'
}
released_cleanly() {  # released_cleanly NAME RANK: every step, one failure entry that is a release, no session lost
  wait_job "$job" 240 "$1"
  local status=$?
  expect_status 0 $status "$1: exit status"
  if [ "$status" != 0 ]; then
    show_warnings "$1"
    echo "    the end of its log:"
    tail -n 40 "$1.txt" | sed 's/^/    | /'
  fi
  expect_contains "$1.txt" "step $STEPS/$STEPS " "$1: every step"
  expect_contains "$1.txt" "releasing env worker $(( $2 - 3 )) (rank $2) on its signal 15" "$1: learner 0 releases it"
  if grep -q "env failures" "$1.txt"; then
    fail "$1: sessions failed"
    show_warnings "$1"
  fi
  python3 - "$WORK/runs/$1" "$2" <<'PY' || fail "$1: summary.json"
import json, sys
s = json.load(open(f"{sys.argv[1]}/summary.json"))
rank = int(sys.argv[2])
print("failures:", s["failures"])
assert s["steps_completed"] == s["steps"] and s["restarts"] == 0, s
[x] = s["failures"]
assert (x["rank"], x["role"]) == (rank, "env_worker"), x
assert x["kind"] == "released: signal 15", x
assert 0 <= x["recovered_after_s"] < 10, x
for phase in ("before", "after"):
    for family, score in s[phase].items():
        assert score["env_failures"] == 0, (phase, family, score)
failed = sum(json.loads(l)["roles"]["learner"]["gauges"].get("learner.step_env_failures", 0)
             for l in open(f"{sys.argv[1]}/metrics.jsonl"))
assert failed == 0, failed
PY
}

# 1. SIGTERM to env worker 1 (rank 4) from outside, at step 2.
start sigterm
hit sigterm 4 TERM 2
released_cleanly sigterm 4
[ -n "$hit_pid" ] && kill -0 "$hit_pid" 2>/dev/null && fail "sigterm: the released env worker still runs"

# 2. moerl ctl release-env on env worker 0 (rank 3).
start ctl
wait_for_line ctl.txt "step 2/$STEPS " 120 || fail "ctl: step 2 never came"
"$MOERL" ctl release-env "$WORK/runs/ctl" 3 >release.txt 2>&1
expect_status 0 $? "ctl release-env"
expect_contains release.txt "released; the job goes on" "ctl release-env reports the release"
released_cleanly ctl 3
# Bad targets are refused, naming the rank and its role.
"$MOERL" ctl release-env "$WORK/runs/ctl" 1 >not_env.txt 2>&1
expect_status 2 $? "ctl release-env on an actor"
expect_contains not_env.txt "rank 1 is actor 0, not an env worker" "ctl names the role"
"$MOERL" ctl release-env "$WORK/runs/ctl" 9 >no_rank.txt 2>&1
expect_status 2 $? "ctl release-env on a rank the job does not have"
expect_contains no_rank.txt "rank-9.json: no such rank record" "ctl names the missing record"
# A rank on another host cannot be signalled from here: ctl says where it runs.
mkdir -p "$WORK/runs/elsewhere/ranks"
echo '{"rank": 3, "role": "env_worker", "role_index": 0, "host": "node-elsewhere", "pid": 4242}' \
  >"$WORK/runs/elsewhere/ranks/rank-3.json"
"$MOERL" ctl release-env "$WORK/runs/elsewhere" 3 >elsewhere.txt 2>&1
expect_status 2 $? "ctl release-env on another host"
expect_contains elsewhere.txt "runs on another host" "ctl refuses a rank on another host"
expect_contains elsewhere.txt "send SIGTERM to pid 4242 on node-elsewhere" "ctl says where to signal it"

# 3. A job-wide SIGTERM (as mpirun forwards it to every rank): a clean stop
# with a checkpoint, and no release.
start everyone --set optim.total_steps=1000
wait_for_line everyone.txt "step 2/1000 " 120 || fail "everyone: step 2 never came"
kill -TERM "$job"
wait_job "$job" 120 "everyone"
grep -q "releasing env worker" everyone.txt && fail "everyone: a job-wide stop was taken for a release"
"$MOERL" checkpoint list "$WORK/runs/everyone/checkpoints" >everyone_list.txt 2>&1
expect_contains everyone_list.txt "valid" "everyone: a checkpoint written at the stop"

# 4. The last env worker is not released: the job stops as on any signal, with a checkpoint.
"${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" --set run.name=last --set optim.total_steps=1000 \
  --set checkpoint.every_steps=0 --init "$TINY_BASE" >last.txt 2>&1 &
job=$!
STEPS=1000 hit last 3 TERM 2
wait_job "$job" 120 "last"
expect_contains last.txt "refused: it is the last env worker" "last: the refusal names why"
"$MOERL" checkpoint list "$WORK/runs/last/checkpoints" >last_list.txt 2>&1
expect_contains last_list.txt "valid" "last: a checkpoint written at the stop"
# 5. Scale back up: release env worker 1 (rank 4), add it back; SIGKILL env
# worker 0 (rank 3), add it back. Every step completes, no session fails,
# both new processes serve sessions to the end.
STEPS=1000
start rejoin --set optim.total_steps=$STEPS --set checkpoint.every_steps=0
wait_for_line rejoin.txt "step 2/$STEPS " 120 || fail "rejoin: step 2 never came"
first_pid=$(rank_pid rejoin 4)
"$MOERL" ctl release-env "$WORK/runs/rejoin" 4 >rejoin_release.txt 2>&1
expect_status 0 $? "rejoin: release-env 4"
"$MOERL" ctl add-env "$WORK/runs/rejoin" 3 >alive.txt 2>&1
expect_status 2 $? "rejoin: add-env on a living env worker is refused"
expect_contains alive.txt "env worker 0 (rank 3) is in the job" "rejoin: the refusal names the rank"
"$MOERL" ctl add-env "$WORK/runs/rejoin" 1 >actor.txt 2>&1
expect_status 2 $? "rejoin: add-env on an actor is refused"
expect_contains actor.txt "rank 1 is actor 0, not an env worker" "rejoin: ctl names the role"
"$MOERL" ctl add-env "$WORK/runs/rejoin" 4 >add4.txt 2>&1
expect_status 0 $? "rejoin: add-env 4"
expect_contains add4.txt "env_worker 1 (rank 4) joined the job again" "rejoin: ctl reports the join"
second_pid=$(rank_pid rejoin 4)
[ -n "$second_pid" ] && [ "$second_pid" != "$first_pid" ] || fail "rejoin: rank 4's record names no new process"
kill -0 "$second_pid" 2>/dev/null || fail "rejoin: the new rank 4 ($second_pid) does not run"
kill -KILL "$(rank_pid rejoin 3)"
wait_for_line rejoin.txt "recovered from the loss of rank 3" 60 || fail "rejoin: the loss of rank 3 was not recovered"
"$MOERL" ctl add-env "$WORK/runs/rejoin" 3 >add3.txt 2>&1
expect_status 0 $? "rejoin: add-env 3 after a SIGKILL"
wait_job "$job" 240 rejoin
status=$?
expect_status 0 $status "rejoin: exit status"
[ "$status" = 0 ] || tail -n 60 rejoin.txt | sed 's/^/    | /'
expect_contains rejoin.txt "step $STEPS/$STEPS " "rejoin: every step"
grep -q "env failures\|failed for good" rejoin.txt && fail "rejoin: sessions failed"
for worker in 0 1; do
  served=$(grep -ao "env_worker $worker (joined during the run): sent [0-9]* replies" rejoin.txt | grep -o "[0-9]* replies")
  [ "${served%% *}" -gt 0 ] 2>/dev/null || fail "rejoin: the new env worker $worker served no session ($served)"
done
python3 - "$WORK/runs/rejoin" <<'PY' || fail "rejoin: summary.json"
import json, sys
s = json.load(open(f"{sys.argv[1]}/summary.json"))
print("failures:", s["failures"], "rejoins:", s["rejoins"])
assert s["steps_completed"] == s["steps"] and s["restarts"] == 0, s
assert [(x["rank"], x["kind"].split(":")[0]) for x in s["failures"]] == [(4, "released"), (3, "lost")], s["failures"]
assert [r["rank"] for r in s["rejoins"]] == [4, 3], s["rejoins"]
assert all(0 < r["joined_after_s"] < 60 for r in s["rejoins"]), s["rejoins"]
PY
finish
