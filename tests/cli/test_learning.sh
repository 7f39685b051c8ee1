# RL improves the policy: a small base pretrained on the sorting family's
# imperfect expert, then 60 GRPO steps with 2 learners, 2 actors and 1 env
# worker in deterministic mode. Held-out success (128 sampled episodes) after
# training beats the base's by at least 0.05 and its reward beats the base's;
# the training reward of the last 15 steps beats that of the first 15 by at
# least 0.02.
#
# Margins that hold on other machines: deterministic mode fixes the run on one
# machine only; another CPU's BLAS kernels give other numbers. Measured with
# OPENBLAS_CORETYPE = Prescott (what OpenBLAS picks on the Intel machine where
# the earlier lr = 3e-4 version failed), Haswell, Zen and Cooperlake, seeds 1-6:
# held-out success rose by 0.15 to 0.31 (32 episodes) and 0.20 to 0.27 (128),
# the training reward by 0.08 to 0.36 (its standard error about 0.03); with
# lr = 3e-4 the rise was 0.03 to 0.13, too close to the noise. The margins
# sit two to three standard errors below the smallest rise measured. The
# quickstart's later reward shaping, sort level and pretraining lr are set
# back here to the values those measurements were made with.
source "$(dirname "$0")/lib.sh" "$@"
CONFIG="$SOURCE_DIR/configs/quickstart.toml"
SMALL=(--set run.output_dir="$WORK/runs" --set 'env.families=["sort"]' --set model.d_model=64 --set model.num_layers=1
       --set moe.num_experts=4 --set moe.d_expert=64 --set pretrain.episodes=300
       --set rollout.eval_episodes=128 --set rollout.eval_greedy=false --set rollout.max_tokens_per_episode=256
       "${TEST_TASKS[@]}" --set pretrain.lr=2e-3 --set pretrain.steps=60)

timeout 300 "$MOERL" pretrain --config "$CONFIG" "${SMALL[@]}" >pretrain.txt 2>&1
expect_status 0 $? "pretrain"
timeout 300 "${LAUNCH[@]}" -n 5 train --config "$CONFIG" "${SMALL[@]}" --set cluster.learners=2 \
  --set optim.total_steps=60 --set optim.lr=1e-3 --set run.deterministic=true --set sync.asynchronous=false \
  --init "$WORK/runs/quickstart/base.pt" >train.txt 2>&1
expect_status 0 $? "train"
python3 - "$WORK/runs/quickstart" <<'PY' || { fail "reward did not rise"; tail -n 5 train.txt | sed 's/^/    | /'; }
import json, sys
run = sys.argv[1]
s = json.load(open(run + "/summary.json"))
before, after = s["before"]["sort"], s["after"]["sort"]
print("held-out sort: success %.2f -> %.2f, reward %.3f -> %.3f" %
      (before["success"], after["success"], before["reward"], after["reward"]))
assert after["success"] >= before["success"] + 0.05 and after["reward"] > before["reward"], (before, after)
lines = [json.loads(l) for l in open(run + "/metrics.jsonl")]
rewards = [l["roles"]["learner"]["gauges"]["learner.reward_mean"] for l in lines]
assert len(rewards) == 60, len(rewards)
first, last = sum(rewards[:15]) / 15, sum(rewards[-15:]) / 15
print("training reward: first 15 steps %.3f, last 15 steps %.3f" % (first, last))
assert last > first + 0.02, (first, last)
PY
finish
