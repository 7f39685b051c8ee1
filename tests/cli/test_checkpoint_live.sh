# Checkpoints of a running job under mpirun (1 learner, 2 actors, 1 env worker):
#   - a learner killed in the middle of a save (fault injection at several
#     points) leaves the previous checkpoint valid; --resume auto uses it and
#     says what it passed over;
#   - the archive directory receives every checkpoint (with its own
#     retention) and the metrics log, copied in the background;
#   - [checkpoint] every_minutes saves without every_steps;
#   - `moerl checkpoint rollback` while the job runs: the learner loads the
#     rolled-back weights, publishes them as a new policy version, and the
#     actors' next trajectories are generated with that version.
source "$(dirname "$0")/lib.sh" "$@"
CONFIG="$SOURCE_DIR/configs/quickstart.toml"
SMALL=("${TEST_TASKS[@]}" --set run.output_dir="$WORK/runs" --set model.d_model=32 --set model.num_heads=2 --set model.num_kv_heads=1
       --set model.num_layers=1 --set moe.d_expert=32 --set moe.num_experts=4 --set rollout.sessions_per_actor=8
       --set rollout.group_size=4 --set rollout.max_tokens_per_episode=192 --set rollout.eval_episodes=1
       --set algo.groups_per_step=2 --set cluster.message_timeout_s=30 --set telemetry.metrics_interval_s=0.2)
train() {  # train NAME STEPS [extra args...]; output in NAME.txt, status in $status
  local name=$1 steps=$2
  shift 2
  timeout 200 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${SMALL[@]}" --set run.name="$name" \
    --set optim.total_steps="$steps" --set checkpoint.every_steps=1 "$@" >"$name.txt" 2>&1
  status=$?
}

# --- Crash during save, at each point; v1 stays what `latest` names. --------
for point in after_arrays before_rename before_index before_latest; do
  train "crash_$point" 3 --set faults.checkpoint_crash_point=$point --set faults.checkpoint_crash_version=2
  [ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "$point: the crashed job exited with $status"
  expect_contains "crash_$point.txt" "injected checkpoint fault at" "$point: the fault fired"
  C="$WORK/runs/crash_$point/checkpoints"
  expect_contains "$C/latest" "v000001" "$point: latest still on v1"
  "$MOERL" checkpoint verify "$C" 1 >verify.txt 2>&1
  expect_status 0 $? "$point: v1 valid after the crash"
done
ls -a "$WORK/runs/crash_after_arrays/checkpoints" | grep -q '^\.v000002\.rank0\.h5\.tmp\.' ||
  fail "after_arrays: no temporary leftover (the crash happened elsewhere?)"
[ -e "$WORK/runs/crash_before_index/checkpoints/v000002.rank0.h5" ] || fail "before_index: shard not in place"
[ -e "$WORK/runs/crash_before_index/checkpoints/v000002.index.json" ] && fail "before_index: index written"

# Resume after a crash before the rename, archiving into a directory of its own.
ARCHIVE="$WORK/archive"
train crash_before_rename 3 --resume auto --set checkpoint.archive_directory="$ARCHIVE" --set checkpoint.archive_keep_last=2
expect_status 0 "$status" "resume after the crash before the rename"
expect_contains crash_before_rename.txt "an interrupted save left '.v000002.rank0.h5.tmp." "leftover reported"
expect_contains crash_before_rename.txt "resumed from $WORK/runs/crash_before_rename/checkpoints version 1" "resumed from v1"
expect_contains crash_before_rename.txt "step 3/3 v3 |" "resumed run finishes"
expect_contains crash_before_rename.txt "archive: copies in $ARCHIVE complete" "archive waited for at the end"
"$MOERL" checkpoint list "$ARCHIVE/checkpoints" >archive.txt 2>&1
expect_status 0 $? "archive list"
expect_contains archive.txt "v000003" "final version archived"
expect_contains archive.txt "v000002" "v2 archived"
grep -q "v000001 " archive.txt && fail "archive retention: v1 should be pruned (archive_keep_last = 2)"
expect_count archive.txt " valid " 2 "archived versions verify"
[ "$(wc -l <"$ARCHIVE/metrics/metrics.jsonl")" -ge 2 ] || fail "metrics log archived"

# A crash after the index, before `latest` moved: v2 is whole but not used.
train crash_before_latest 3 --resume auto
expect_status 0 "$status" "resume after the crash before latest"
expect_contains crash_before_latest.txt "not using v000002: complete and valid, but \`latest\` names v000001" "newer version passed over, said"
expect_contains crash_before_latest.txt "step 2/3 v2 |" "training redoes step 2"

# A crash before the index: v2's shard without an index is incomplete.
train crash_before_index 3 --resume auto
expect_status 0 "$status" "resume after the crash before the index"
expect_contains crash_before_index.txt "not using v000002: version v000002 is incomplete" "incomplete version passed over, said"

# --- every_minutes alone, and a rollback while the job runs. -----------------
"${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${SMALL[@]}" --set run.name=live --set optim.total_steps=1000 \
  --set checkpoint.every_steps=0 --set checkpoint.every_minutes=0.0001 --set checkpoint.keep_last=100000 >live.txt 2>&1 &
launcher=$!
L="$WORK/runs/live/checkpoints"
saves() { grep -c 'checkpoint version [0-9]* saved' live.txt; }
# Two saves within 2 minutes (a loaded machine makes slow steps and slow saves).
for _ in $(seq 1 240); do [ "$(saves)" -ge 2 ] && break; sleep 0.5; done
[ "$(saves)" -ge 2 ] || { fail "every_minutes saves without every_steps"; tail -20 live.txt | sed 's/^/    | /'; }
# Retention keeps every version here: on an idle machine this tiny run makes
# dozens of steps per second. every_minutes may skip a step's save when steps
# are faster than the interval, so roll back to the oldest saved version.
target=$("$MOERL" checkpoint list "$L" | awk '/ valid / {print substr($1, 2) + 0; exit}')
[ -n "$target" ] || fail "no saved version to roll back to"
"$MOERL" checkpoint rollback "$L" --to "$target" >rollback.txt 2>&1
status=$?
expect_status 0 "$status" "rollback while running"
[ "$status" = 0 ] || { sed 's/^/    | /' rollback.txt; tail -20 live.txt | sed 's/^/    | /'; }
for _ in $(seq 1 120); do grep -q "rollback: \`latest\` was moved to v$target " live.txt && break; sleep 0.5; done
bumped=$(sed -n 's/.*publishing them as policy version \([0-9]*\).*/\1/p' live.txt | head -1)
[ -n "$bumped" ] || fail "the learner did not notice the rollback"
# Wait until a step trained on episodes of the new version, then stop the job.
for _ in $(seq 1 120); do grep -q "/1000 v$((bumped + 2)) |" live.txt && break; sleep 0.5; done
sleep 1
kill -TERM $launcher
wait $launcher
expect_contains live.txt "rollback: \`latest\` was moved to v$target (learner step $target)" "rollback log names the version"
python3 - "$WORK/runs/live/metrics.jsonl" "$bumped" "$target" <<'PY' || fail "metrics after the rollback"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
bumped, target = int(sys.argv[2]), int(sys.argv[3])
after = [l for l in lines if l["roles"]["learner"]["gauges"].get("learner.rolled_back_to") == target]
assert after, "no metrics line records the rollback to v%d" % target
# The actors received the version that carries the rolled-back weights, and generated with it.
assert any(l["roles"]["actor"]["gauges"].get("actor.policy_version", -1) >= bumped for l in after), \
    [l["roles"]["actor"]["gauges"].get("actor.policy_version") for l in after]
PY
finish
