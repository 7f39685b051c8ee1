# Deterministic mode and exact resume under mpirun (1 learner, 2 actors, 1 env
# worker; then 2 learners, 1 actor, 1 env worker) on a tiny model:
#   - two runs of the same config write bitwise-equal checkpoints;
#   - N+M steps in one run equal N steps, stop, --resume auto, M steps:
#     weights, optimizer state, RNG states, staleness counters and the data
#     cursor are bitwise equal (`moerl checkpoint diff`);
#   - the diff does fail on checkpoints that differ, naming the array.
source "$(dirname "$0")/lib.sh" "$@"
CONFIG="$SOURCE_DIR/configs/quickstart.toml"
# Entropy bonus and no dynamic sampling: every step changes every weight even
# when all rewards of a group are equal, so equal checkpoints mean something.
SMALL=("${TEST_TASKS[@]}" --set run.output_dir="$WORK/runs" --set model.d_model=32 --set model.num_heads=2 --set model.num_kv_heads=1
       --set model.num_layers=1 --set moe.d_expert=32 --set moe.num_experts=4 --set rollout.sessions_per_actor=8
       --set rollout.group_size=4 --set rollout.max_tokens_per_episode=192 --set rollout.eval_episodes=1
       --set algo.groups_per_step=2 --set algo.drop_zero_variance_groups=false --set algo.entropy_coef=0.01
       --set cluster.message_timeout_s=30 --set telemetry.metrics_interval_s=0.2
       --set run.deterministic=true --set sync.asynchronous=false --set checkpoint.keep_last=10)

# Deterministic mode refuses asynchronous rollouts, naming both keys.
"$MOERL" config check "$CONFIG" --set run.deterministic=true >bad.txt 2>&1
expect_status 2 $? "deterministic + asynchronous"
expect_contains bad.txt "run.deterministic" "the key at fault"
expect_contains bad.txt "sync.asynchronous = false" "the fix"

train() {  # train NAME RANKS STEPS [extra args...]
  local name=$1 ranks=$2 steps=$3
  shift 3
  # 120 s per job (each takes 10-20 s): a hung one is named before ctest's 300 s for the whole test.
  run_job "$name" 120 "${LAUNCH[@]}" -n "$ranks" train --config "$CONFIG" "${SMALL[@]}" --set run.name="$name" \
    --set optim.total_steps="$steps" --set checkpoint.every_steps=2 "$@"
  expect_status 0 $? "train $name"
}
same() {  # same A B WHAT: two versions are bitwise equal
  "$MOERL" checkpoint diff "$1" "$2" >diff.txt 2>&1
  expect_status 0 $? "$3"
  expect_contains diff.txt "are identical" "$3"
}

# One run of 4 steps (checkpoints v2, v4) and one of 2 steps resumed for 2 more.
train straight 4 4
train split 4 2
expect_contains split.txt "step 2/2 v2 |" "first half"
train split 4 4 --resume auto
expect_contains split.txt "resumed from $WORK/runs/split/checkpoints version 2" "resume named"
expect_contains split.txt "step 3/4 v3 |" "resumed at step 3"
grep -q "step 1/4" split.txt && fail "resumed run restarted from step 1"

S="$WORK/runs/straight/checkpoints"
P="$WORK/runs/split/checkpoints"

# A resume keeps the books: learner 0 dies while saving version 4 (after
# writing step 4's metrics line), the resumed run repeats steps 3 and 4 from
# version 2. metrics.jsonl then holds each step once, and summary.json keeps
# the first run's `before` evaluation (equal to the straight run's: deterministic).
run_job crashed 120 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${SMALL[@]}" --set run.name=crashed \
  --set optim.total_steps=4 --set checkpoint.every_steps=2 --set faults.checkpoint_crash_point=before_rename \
  --set faults.checkpoint_crash_version=4
status=$?
[ $status -ne 0 ] || fail "the run with a crash in the save of version 4 exited 0"
[ $status -ne 124 ] && [ $status -ne 137 ] || fail "the run with a crash in the save of version 4 did not end by itself"
train crashed 4 4 --resume auto
expect_contains crashed.txt "resumed from $WORK/runs/crashed/checkpoints version 2" "crashed: resumed from version 2"
python3 - "$WORK/runs" <<'PY' || fail "the resumed run's books"
import json, sys
runs = sys.argv[1]
steps = [json.loads(l)["step"] for l in open(runs + "/crashed/metrics.jsonl")]
assert steps == [1, 2, 3, 4], ("metrics.jsonl steps", steps)
straight = json.load(open(runs + "/straight/summary.json"))
crashed = json.load(open(runs + "/crashed/summary.json"))
assert crashed["before"] == straight["before"] and crashed["before"], (crashed["before"], straight["before"])
for family, score in crashed["before"].items():
    assert score["episodes"] + score["env_failures"] == 1, (family, score)
print("resumed books: steps", steps, "before", crashed["before"])
PY
same "$S:4" "$WORK/runs/crashed/checkpoints:4" "a crash in a save, then resume: equal to the straight run"
same "$S:2" "$P:2" "two runs of the same config: equal checkpoints after 2 steps"
same "$S:4" "$P:4" "4 straight steps equal 2 + resume + 2"
# What was compared includes the optimizer, RNG and staleness state and the cursor.
"$MOERL" checkpoint diff "$S:4" "$P:4" >diff.txt 2>&1
grep -qE "arrays \(model [0-9]+, optimizer [0-9]+, rng 1, state 1;" diff.txt ||
  fail "weights, optimizer, rng and staleness arrays compared: $(cat diff.txt)"
if command -v h5dump >/dev/null; then
  h5dump -A "$P/v000004.rank0.h5" >attrs.txt 2>&1
  expect_contains attrs.txt "staleness.taken_groups" "staleness counters saved"
  expect_contains attrs.txt "coordinator.next_seed" "cursor saved"
  expect_contains attrs.txt "program_version" "program version saved"
fi

# The diff can fail: versions 2 and 4 of one run differ, and it says where.
"$MOERL" checkpoint diff "$S:2" "$S:4" >diff.txt 2>&1
expect_status 1 $? "different versions"
expect_contains diff.txt "array model/" "first differing weights named"
expect_contains diff.txt "max |a - b|" "size of the difference"
expect_contains diff.txt "attribute policy_version: 2 vs 4" "attribute difference"

# Two data-parallel learners (gradient all-reduce, one RNG state each).
train straight2 4 4 --set cluster.learners=2 --set cluster.actors=1
train split2 4 2 --set cluster.learners=2 --set cluster.actors=1
train split2 4 4 --set cluster.learners=2 --set cluster.actors=1 --resume auto
same "$WORK/runs/straight2/checkpoints:4" "$WORK/runs/split2/checkpoints:4" "2 learners: straight equals resumed"
out=$("$MOERL" checkpoint diff "$WORK/runs/straight2/checkpoints:4" "$WORK/runs/split2/checkpoints:4" 2>&1)
echo "$out" | grep -qE "optimizer [0-9]+, rng 2, state 1;" || fail "2 learners: both RNG states compared: $out"

# The gradient all-reduce in small buckets overlapping the backward, and in
# one piece after it: with two learners each sum is a + b either way, so the
# weights are bitwise those of the default run.
train flat2 4 4 --set cluster.learners=2 --set cluster.actors=1 --set optim.gradient_bucket_mb=0
train buckets2 4 4 --set cluster.learners=2 --set cluster.actors=1 --set optim.gradient_bucket_mb=0.004
same "$WORK/runs/straight2/checkpoints:4" "$WORK/runs/flat2/checkpoints:4" "2 learners: default buckets equal one all-reduce"
same "$WORK/runs/buckets2/checkpoints:4" "$WORK/runs/flat2/checkpoints:4" "2 learners: small buckets equal one all-reduce"
grep -qE '"learner.gradient_buckets_in_backward":([2-9]|[1-9][0-9]+)[,}]' "$WORK/runs/buckets2/metrics.jsonl" ||
  fail "small buckets: no step started more than one all-reduce during the backward"
grep -q "gradient_buckets_in_backward" "$WORK/runs/flat2/metrics.jsonl" &&
  fail "gradient_bucket_mb = 0 still ran the overlapped all-reduce"
finish
