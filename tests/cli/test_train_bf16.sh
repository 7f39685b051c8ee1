# [run] dtype = "bfloat16" end to end under mpirun on the CPU: the learner
# trains on a bf16 copy of its float32 master weights, the actors generate
# with bf16 weights and KV cache, and every published version reaches them
# as bf16 host bytes (sync::HostWeights). A dense model first, then the MoE
# model (bf16 dispatch, expert GEMMs and combine with float32 sums).
source "$(dirname "$0")/lib.sh" "$@"
DENSE=("${TINY[@]}" --set moe.enabled=false)
timeout 120 "$MOERL" pretrain --config "$CONFIG" "${DENSE[@]}" >pretrain.txt 2>&1
expect_status 0 $? "pretrain (dense)"

run_job train 300 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${DENSE[@]}" --set run.dtype=bfloat16 \
  --set optim.total_steps=3 --set algo.kl='"k3"' --set algo.entropy_coef=0.01 \
  --set algo.drop_zero_variance_groups=false --init "$TINY_BASE"
expect_status 0 $? "train in bfloat16"
for step in 1 2 3; do expect_contains train.txt "step $step/3 v$step |" "progress line of step $step"; done
# The first step trains on episodes of version 0: the learner's bf16 copy
# rounds the same float32 weights the actors rounded, so the behaviour and
# learner log-probs agree (float32 against bf16 would differ by ~0.01 nats).
grep "^step 1/3" train.txt | grep -qF "|logp gap| 0.00" || fail "step 1: learner and actors disagree on log-probs"
grep "^step" train.txt | grep -qiw "nan" && fail "a NaN in the progress lines"
expect_contains train.txt "held-out success at temperature" "the final evaluation ran on the last version"
[ -s "$WORK/runs/quickstart/summary.json" ] || fail "summary.json written"

# The MoE model in bf16, routing replayed: the same agreement at version 0.
pretrain_tiny
run_job moe 300 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" --set run.dtype=bfloat16 \
  --set run.name=moe_bf16 --set optim.total_steps=3 --set algo.drop_zero_variance_groups=false --init "$TINY_BASE"
expect_status 0 $? "train the MoE model in bfloat16"
for step in 1 2 3; do expect_contains moe.txt "step $step/3 v$step |" "MoE progress line of step $step"; done
grep "^step 1/3" moe.txt | grep -qF "|logp gap| 0.00" || fail "MoE step 1: learner and actors disagree on log-probs"
grep "^step" moe.txt | grep -qiw "nan" && fail "a NaN in the MoE progress lines"
finish
