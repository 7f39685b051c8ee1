# RL improves the policy: a small base pretrained on the sorting family's
# imperfect expert, then 60 GRPO steps with 2 learners, 2 actors and 1 env
# worker in deterministic mode (fixed seed, reproducible on this machine).
# Held-out success and reward after training beat the base's, and the
# training reward of the last 15 steps beats that of the first 15.
source "$(dirname "$0")/lib.sh" "$@"
CONFIG="$SOURCE_DIR/configs/quickstart.toml"
SMALL=(--set run.output_dir="$WORK/runs" --set 'env.families=["sort"]' --set model.d_model=64 --set model.num_layers=1
       --set moe.num_experts=4 --set moe.d_expert=64 --set pretrain.episodes=300 --set pretrain.steps=60
       --set rollout.eval_episodes=32 --set rollout.max_tokens_per_episode=256)

timeout 300 "$MOERL" pretrain --config "$CONFIG" "${SMALL[@]}" >pretrain.txt 2>&1
expect_status 0 $? "pretrain"
timeout 300 "${MPIRUN[@]}" -np 5 "$MOERL" train --config "$CONFIG" "${SMALL[@]}" --set cluster.learners=2 \
  --set optim.total_steps=60 --set optim.lr=3e-4 --set run.deterministic=true --set sync.asynchronous=false \
  --init "$WORK/runs/quickstart/base.pt" >train.txt 2>&1
expect_status 0 $? "train"
python3 - "$WORK/runs/quickstart" <<'PY' || { fail "reward did not rise"; tail -n 5 train.txt | sed 's/^/    | /'; }
import json, sys
run = sys.argv[1]
s = json.load(open(run + "/summary.json"))
before, after = s["before"]["sort"], s["after"]["sort"]
print("held-out sort: success %.2f -> %.2f, reward %.3f -> %.3f" %
      (before["success"], after["success"], before["reward"], after["reward"]))
assert after["reward"] > before["reward"], (before, after)
lines = [json.loads(l) for l in open(run + "/metrics.jsonl")]
rewards = [l["roles"]["learner"]["gauges"]["learner.reward_mean"] for l in lines]
assert len(rewards) == 60, len(rewards)
first, last = sum(rewards[:15]) / 15, sum(rewards[-15:]) / 15
print("training reward: first 15 steps %.3f, last 15 steps %.3f" % (first, last))
assert last > first, (first, last)
PY
finish
