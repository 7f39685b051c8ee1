# The RL loop end to end under mpirun: 1 learner, 2 actors, 1 env worker on
# a tiny model for a few steps. Every step is reported, weights versions reach
# the actors, the before/after evaluation is written, and every rank exits 0.
source "$(dirname "$0")/lib.sh" "$@"
timeout 300 "$MOERL" pretrain --config "$CONFIG" "${TINY[@]}" >pretrain.txt 2>&1
expect_status 0 $? "pretrain"
expect_contains pretrain.txt "saved $WORK/runs/quickstart/base.pt" "pretrain saves the base"

timeout 300 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" --set optim.total_steps=4 \
  --init "$WORK/runs/quickstart/base.pt" >train.txt 2>&1
expect_status 0 $? "train"
for step in 1 2 3 4; do expect_contains train.txt "step $step/4 v$step |" "progress line of step $step"; done
expect_contains train.txt "held-out success at temperature" "evaluation table"
python3 - "$WORK/runs/quickstart/summary.json" <<'PY' || fail "summary.json"
import json, sys
s = json.load(open(sys.argv[1]))
assert s["steps"] == 4, s
for phase in ("before", "after"):
    assert set(s[phase]) == {"arithmetic", "guess", "sort"}, s[phase]
    for family, score in s[phase].items():
        assert score["episodes"] == 2 and 0 <= score["success"] <= 1, (phase, family, score)
PY
# One metrics line per step, and every role reported to learner 0.
python3 - "$WORK/runs/quickstart/metrics.jsonl" <<'PY' || fail "metrics.jsonl during training"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["step"] for l in lines] == [1, 2, 3, 4], [l["step"] for l in lines]
roles = set(lines[-1]["roles"])
assert roles == {"learner", "actor", "env_worker"}, roles
assert lines[-1]["roles"]["learner"]["gauges"]["learner.reward_mean"] >= 0
assert lines[-1]["roles"]["actor"]["counters"]["rollout.generated_tokens"] > 0
PY

# Checkpoints: the 4-step run saved versions 2 and 4 (every_steps is set
# below on a run of its own); resuming continues the version count.
timeout 300 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" --set optim.total_steps=4 \
  --set checkpoint.every_steps=2 --set run.name=ckpt --init "$WORK/runs/quickstart/base.pt" >ckpt.txt 2>&1
expect_status 0 $? "train with checkpoints"
"$MOERL" checkpoint list "$WORK/runs/ckpt/checkpoints" >list.txt 2>&1
expect_status 0 $? "checkpoint list"
expect_contains list.txt "v000002" "version 2 saved"
expect_contains list.txt "v000004" "version 4 saved"
timeout 300 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" --set optim.total_steps=6 \
  --set checkpoint.every_steps=2 --set run.name=ckpt --init "$WORK/runs/quickstart/base.pt" --resume auto >resume.txt 2>&1
expect_status 0 $? "resume"
expect_contains resume.txt "step 5/6 v5 |" "resumed run continues at step 5"
expect_contains resume.txt "step 6/6 v6 |" "resumed run reaches step 6"
grep -q "step 1/6" resume.txt && fail "resumed run restarted from step 1"

# A stop signal mid-run: every rank stops cleanly and learner 0 saves first.
"${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" --set optim.total_steps=1000 \
  --set checkpoint.every_steps=0 --set run.name=stopped --init "$WORK/runs/quickstart/base.pt" >stopped.txt 2>&1 &
launcher=$!
for _ in $(seq 1 120); do grep -q "step 2/1000" stopped.txt && break; sleep 0.5; done
kill -TERM $launcher
wait $launcher
"$MOERL" checkpoint list "$WORK/runs/stopped/checkpoints" >list2.txt 2>&1
expect_status 0 $? "checkpoint list after a stop"
expect_contains list2.txt "valid" "a checkpoint written at the stop"

# Two data-parallel learners (they check after every step that their weights
# agree; a divergence would stop the job) and asynchronous staleness 0: stale
# groups are dropped and counted.
timeout 300 "${LAUNCH[@]}" -n 5 train --config "$CONFIG" "${TINY[@]}" --set optim.total_steps=3 \
  --set cluster.learners=2 --set sync.max_staleness=0 --set algo.groups_per_step=2 --set run.name=two \
  --init "$WORK/runs/quickstart/base.pt" >train2.txt 2>&1
expect_status 0 $? "train with 2 learners"
expect_contains train2.txt "step 3/3 v3 |" "2-learner progress"
grep -q "dropped [0-9]* stale groups" train2.txt || echo "note: no group was stale in this run"

# The optional loss terms and micro-batching run together: KL to the frozen
# start (k3), entropy bonus, overlong penalty, 2 micro-batches, and the
# router-disagreement measurement every step.
timeout 300 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" --set optim.total_steps=2 \
  --set algo.kl=k3 --set algo.kl_coef=0.01 --set algo.entropy_coef=0.001 --set algo.overlong_cache_tokens=64 \
  --set optim.grad_accumulation=2 --set algo.routing_check_interval=1 --set run.name=options \
  --init "$WORK/runs/quickstart/base.pt" >train3.txt 2>&1
expect_status 0 $? "train with every loss option"
expect_contains train3.txt "router disagrees" "router disagreement measured"

# A wrong --init is refused before training, naming the file.
timeout 120 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" --init "$WORK/missing.pt" >bad.txt 2>&1
status=$?
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "missing --init: exit status $status"
expect_contains bad.txt "missing.pt' does not exist" "missing --init named"
finish
