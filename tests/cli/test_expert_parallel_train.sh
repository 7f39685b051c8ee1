# `moerl train` with expert-parallel learners ([cluster] expert_parallel)
# and actors ([rollout] expert_parallel) under mpirun: 2 learners, 1 actor
# (2 in the last runs), 1 env worker on a tiny model with 4 experts,
# deterministic and synchronous.
#   - a bad size is refused before any work, naming the key;
#   - 10 steps with the experts split over the 2 learners end with the
#     weights and optimizer state of 10 steps with every expert on both
#     (within float32 rounding: the expert gradients sum in another order);
#     the sharded version has one shard per learner;
#   - a run split over 2 learners, stopped after 2 steps, resumes with whole
#     learners (resharding) and ends where the straight run ends, and a
#     whole run resumes split;
#   - learners and actors both split (each actor group decoding in step,
#     each actor receiving its share of every version) end where whole ones end;
#   - the comparison does fail on versions a step apart.
source "$(dirname "$0")/lib.sh" "$@"
SMALL=("${TEST_TASKS[@]}" --set run.output_dir="$WORK/runs" --set model.d_model=32 --set model.num_heads=2 --set model.num_kv_heads=1
       --set model.num_layers=1 --set moe.d_expert=32 --set moe.num_experts=4 --set rollout.sessions_per_actor=8
       --set rollout.group_size=4 --set rollout.max_tokens_per_episode=192 --set rollout.eval_episodes=1
       --set algo.groups_per_step=2 --set algo.drop_zero_variance_groups=false --set algo.entropy_coef=0.01
       --set cluster.message_timeout_s=30 --set telemetry.metrics_interval_s=0.2 --set cluster.learners=2
       --set cluster.actors=1 --set cluster.env_workers=1
       --set run.deterministic=true --set sync.asynchronous=false --set checkpoint.keep_last=10)

"$MOERL" config check "$CONFIG" "${SMALL[@]}" --set cluster.expert_parallel=3 >bad.txt 2>&1
expect_status 2 $? "expert_parallel = 3 with 2 learners"
expect_contains bad.txt "cluster.expert_parallel" "the key at fault"
expect_contains bad.txt "must divide cluster.learners (2)" "the rule"

"$MOERL" config check "$CONFIG" "${SMALL[@]}" --set rollout.expert_parallel=2 >bad.txt 2>&1
expect_status 2 $? "rollout.expert_parallel = 2 with 1 actor"
expect_contains bad.txt "rollout.expert_parallel" "the key at fault"
expect_contains bad.txt "must divide cluster.actors (1)" "the actors' rule"
"$MOERL" config check "$CONFIG" "${SMALL[@]}" --set cluster.actors=2 --set cluster.standby_actors=1 \
  --set rollout.expert_parallel=2 >bad.txt 2>&1
expect_status 2 $? "rollout.expert_parallel with a standby actor"
expect_contains bad.txt "set cluster.standby_actors = 0" "the fix"

train() {  # train NAME EXPERT_PARALLEL STEPS [extra args...]
  local name=$1 ep=$2 steps=$3
  shift 3
  local ranks=4
  if [ "${1:-}" = -n ]; then ranks=$2; shift 2; fi
  run_job "$name" 120 "${LAUNCH[@]}" -n "$ranks" train --config "$CONFIG" "${SMALL[@]}" --set run.name="$name" \
    --set cluster.expert_parallel="$ep" --set optim.total_steps="$steps" --set checkpoint.every_steps=2 "$@"
  expect_status 0 $? "train $name"
}
# Equal within float32 rounding; a step of training moves weights by ~1e-3.
close() {  # close A B WHAT
  "$MOERL" checkpoint diff "$1" "$2" --tolerance 1e-6 >diff.txt 2>&1
  expect_status 0 $? "$3"
  grep -qE "are (identical|equal within tolerance)" diff.txt || { fail "$3: not equal"; sed 's/^/    | /' diff.txt; }
}

R="$WORK/runs"
train whole10 1 10
train split10 2 10
[ -f "$R/split10/checkpoints/v000010.rank1.h5" ] || fail "the split run's version 10 has no shard of learner 1"
[ -f "$R/whole10/checkpoints/v000010.rank1.h5" ] && fail "the whole run's version 10 has a second shard"
close "$R/whole10/checkpoints:10" "$R/split10/checkpoints:10" "10 steps split equal 10 steps whole"
expect_contains diff.txt "layouts differ" "the diff names the two layouts"
expect_contains diff.txt "expert-parallel 2 (experts [0, 2) [2, 4) of 4)" "the split layout"

train whole 1 4
train split 2 4

# Resharding in a running job: split -> whole, and whole -> split.
train split_then_whole 2 2
train split_then_whole 1 4 --resume auto
expect_contains split_then_whole.txt "step 3/4 v3 |" "resumed at step 3 with whole learners"
close "$R/whole/checkpoints:4" "$R/split_then_whole/checkpoints:4" "2 steps split + 2 whole equal 4 whole"
train whole_then_split 1 2
train whole_then_split 2 4 --resume auto
expect_contains whole_then_split.txt "step 3/4 v3 |" "resumed at step 3 with split learners"
close "$R/whole/checkpoints:4" "$R/whole_then_split/checkpoints:4" "2 steps whole + 2 split equal 4 whole"

# Both sides split: 2 actors in one expert group, each holding 2 of the 4 experts.
train whole_actors 1 4 -n 5 --set cluster.actors=2
train split_actors 2 4 -n 5 --set cluster.actors=2 --set rollout.expert_parallel=2 --log-level debug
expect_contains split_actors.txt "experts [2, 4) of 4 (expert group of 2 actors)" "actor 1 holds the second share"
close "$R/whole_actors/checkpoints:4" "$R/split_actors/checkpoints:4" "split learners and actors equal whole ones"

# The tolerance is not blind: versions a step apart differ.
"$MOERL" checkpoint diff "$R/whole/checkpoints:4" "$R/split/checkpoints:2" --tolerance 1e-6 >far.txt 2>&1
expect_status 1 $? "versions 2 and 4 compared"
expect_contains far.txt "array model/layers.0.mlp.experts" "the experts differ between steps"
finish
