# RL on a Hugging Face model with its own tokenizer: `moerl train` on the
# qwen2_moe fixture (1 learner, 1 actor, 1 env worker) runs 3 steps, and the
# actor renders the episodes in ChatML through the model's tokenizer.json
# ([chat] layout = "auto"); rollout.moe_top_k overrides config.json's
# experts per token for the actors; a layout that does not fit the tokenizer
# is a configuration error naming the key and the file.
source "$(dirname "$0")/lib.sh" "$@"
# The fixture allows 64 positions, fewer than one sort task statement takes in
# ChatML with its 973-token vocabulary (about 70): a copy with a longer
# context. Rotary positions have no weights, so the model is the same.
mkdir model && cp "$SOURCE_DIR/tests/parity/fixtures/qwen2_moe"/* model/
sed -i 's/"max_position_embeddings": 64,/"max_position_embeddings": 256,/' model/config.json
grep -q '"max_position_embeddings": 256,' model/config.json || fail "the fixture's context was not lengthened"
cat > run.toml <<EOF
[run]
output_dir = "$WORK/runs"
name = "hf"
[cluster]
learners = 1
actors = 1
env_workers = 1
message_timeout_s = 30
[model]
source = "hf:$WORK/model"
[rollout]
sessions_per_actor = 4
group_size = 2
max_tokens_per_turn = 8
max_tokens_per_episode = 256
eval_episodes = 0
[algo]
groups_per_step = 2
drop_zero_variance_groups = false
[env]
families = ["sort"]
max_turns = 2
[optim]
total_steps = 3
[checkpoint]
every_steps = 0
[telemetry]
log_level = "debug"
metrics_interval_s = 0.2
EOF

timeout 120 "${LAUNCH[@]}" -n 3 train --config run.toml >train.txt 2>&1
expect_status 0 $? "train on an hf: source"
for step in 1 2 3; do expect_contains train.txt "step $step/3 v$step |" "progress line of step $step"; done
expect_contains train.txt "with tokenizer $WORK/model/tokenizer.json" "the actor uses the model's tokenizer"
# The actor's debug dump of each episode: ChatML headers around the task
# statement, and none of the byte tokenizer's role tokens.
expect_contains train.txt "<|im_start|>user" "episodes open user turns with <|im_start|>user"
expect_contains train.txt "<|im_end|>" "user turns end with <|im_end|>"
expect_contains train.txt "<|im_start|>assistant" "the policy's turns follow <|im_start|>assistant"
expect_contains train.txt "sort: sort the list ascending." "the task statement round-trips through the tokenizer"
grep -qF "<|user|>" train.txt && fail "byte-layout role tokens in an hf: run"
python3 - "$WORK/runs/hf/metrics.jsonl" <<'PY' || fail "metrics.jsonl of the hf: run"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["step"] for l in lines] == [1, 2, 3], [l["step"] for l in lines]
learner = lines[-1]["roles"]["learner"]
assert learner["counters"]["learner.generated_tokens"] > 0, learner
PY

# Rollouts routing with another number of experts than config.json's
# num_experts_per_tok (2): refused with routing replay, naming both keys;
# without it the job trains, and learner 0 warns once that behaviour
# log-probs come from another routing.
"$MOERL" config check run.toml --set rollout.moe_top_k=1 >replay.txt 2>&1
expect_status 2 $? "rollout.moe_top_k with routing replay"
expect_contains replay.txt "[rollout] moe_top_k: = 1 differs from moe.top_k = 2, and algo.routing_replay = true" \
  "the error names both keys"
timeout 120 "${LAUNCH[@]}" -n 3 train --config run.toml --set rollout.moe_top_k=1 --set algo.routing_replay=false \
  --set optim.total_steps=1 --set run.name=hf_k1 >k1.txt 2>&1
expect_status 0 $? "train on an hf: source with rollout.moe_top_k = 1"
expect_contains k1.txt "step 1/1 v1 |" "progress line of the one step"
expect_count k1.txt "rollout.moe_top_k = 1: actors route each token to 1 expert(s), the learner trains with moe.top_k = 2 (config.json's)" 1 \
  "one warning for the job"

"$MOERL" config check run.toml --set 'chat.end_of_turn="<|eot_id|>"' >bad.txt 2>&1
expect_status 2 $? "an end_of_turn the tokenizer lacks"
expect_contains bad.txt "[chat] end_of_turn" "the error names the key"
expect_contains bad.txt "$WORK/model/tokenizer.json" "the error names the tokenizer file"
# Layout "auto" on a model directory without tokenizer.json: `moerl train`
# refuses it before any work, on every rank, naming the key.
mkdir notok && cp model/config.json model/*.safetensors* notok/
timeout 60 "${LAUNCH[@]}" -n 3 train --config run.toml --set "model.source=\"hf:$WORK/notok\"" >notok.txt 2>&1
expect_status 2 $? "train with no tokenizer for layout auto"
expect_contains notok.txt "[chat] layout" "the error names chat.layout"
expect_contains notok.txt "$WORK/notok has no tokenizer.json" "the error names the directory"
grep -q "step 1/3" notok.txt && fail "training started without a tokenizer"
finish
