# Every objective end to end on a tiny model, through `moerl bench algos
# --quick`: GRPO, Dr.GRPO, RLOO, PPO (value head + GAE), GRPO+GSPO and GRPO with
# credit per turn, each a
# real 4-step job (scripts/launch.sh -n 4 train) from the same base. For each:
# the loss and reward statistics of every step in metrics.jsonl are finite
# (PPO's value loss and explained variance too), the held-out rewards in
# summary.json are finite, and the weights moved. The bench writes its JSON
# and markdown tables and the learning-curve PNGs (or says that matplotlib is
# missing).
#
# Weights moved: `moerl checkpoint diff` against a control run of the same
# job at lr = 1e-30, whose Adam steps (about lr per weight) are far below
# float32 resolution: its checkpoint holds the base's weights. The control's
# own versions 1 and 3 must not differ in any model array (so the check does
# report a run whose update did nothing); each objective's final version must
# differ from it in most model arrays.
source "$(dirname "$0")/lib.sh" "$@"
pretrain_tiny
OBJECTIVES=(grpo dr_grpo rloo ppo gspo grpo_turn)
# The tiny base never succeeds: every group's rewards are all zero and the
# group-relative objectives rightly skip the update. The soft overlong
# penalty over the whole episode budget (DAPO's, linear in the generated
# length) gives episodes of different lengths different rewards.
RL=("${TINY[@]}" --set algo.overlong_cache_tokens=256)
# The bench plots with Debian's interpreter, where python3-matplotlib lives.
PLOT_PYTHON=/usr/bin/python3
[ -x "$PLOT_PYTHON" ] || PLOT_PYTHON=python3

timeout 240 env MOERL_BIN="$MOERL" "$MOERL" bench algos --quick --dir "$WORK/bench" --init "$TINY_BASE" \
  "${RL[@]}" --out algos.json >bench.txt 2>&1
expect_status 0 $? "bench algos --quick"
for objective in "${OBJECTIVES[@]}"; do expect_contains bench.txt "| $objective | 1 | sort |" "table row of $objective"; done
[ -s "$WORK/bench/algos.md" ] || fail "bench algos wrote no algos.md"

# The control: GRPO at lr = 1e-30, a checkpoint after every step.
timeout 100 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${RL[@]}" --set run.name=frozen --set optim.total_steps=3 \
  --set optim.lr=1e-30 --set checkpoint.every_steps=1 --init "$TINY_BASE" >frozen.txt 2>&1
expect_status 0 $? "control run at lr = 1e-30"
FROZEN="$WORK/runs/frozen/checkpoints"

# moved A B: "MOVED TOTAL LARGEST HEAD": model arrays of A and B whose
# largest difference exceeds 1e-12, of all model arrays, the largest
# difference, and 1 if the output head (lm_head) moved: only the policy loss
# reaches it (the MoE balance loss does not).
moved() {
  "$MOERL" checkpoint diff "$1" "$1" >same.txt 2>&1
  "$MOERL" checkpoint diff "$1" "$2" >diff.txt 2>&1
  python3 - same.txt diff.txt <<'PY'
import re, sys
same, diff = open(sys.argv[1]).read(), open(sys.argv[2]).read()
total = re.search(r"arrays \(.*?\bmodel (\d+)", same)
assert total, "checkpoint diff of a version with itself: " + same
moved, largest, head = 0, 0.0, 0
for line in diff.splitlines():
    m = re.match(r"\s*array model/(\S+): .*max \|a - b\| (\S+)", line)
    if m and float(m.group(2)) > 1e-12:
        largest = max(largest, float(m.group(2)))
        moved += 1
        head |= m.group(1) == "lm_head.weight"
print(moved, total.group(1), largest, head)
PY
}
read -r n total largest head <<<"$(moved "$FROZEN:1" "$FROZEN:3")"
echo "control: $n of $total model arrays moved from v1 to v3 (largest change $largest)"
[ "$n" = 0 ] && [ "${total:-0}" -gt 0 ] || fail "the lr = 1e-30 control moved $n of ${total:-?} model arrays (largest $largest)"

for objective in "${OBJECTIVES[@]}"; do
  run="$WORK/bench/algos-$objective-s1"
  python3 - "$run" "$objective" <<'PY' || fail "$objective: statistics"
import json, math, sys
run, objective = sys.argv[1], sys.argv[2]
def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)
lines = [json.loads(l) for l in open(run + "/metrics.jsonl")]
assert [l["step"] for l in lines] == [1, 2, 3, 4], [l["step"] for l in lines]
wanted = ["learner.loss", "learner.reward_mean", "learner.entropy", "learner.grad_norm"]
if objective == "ppo":
    wanted += ["learner.value_loss", "learner.value_mean", "learner.explained_variance"]
for l in lines:
    gauges = l["roles"]["learner"]["gauges"]
    for name in wanted:
        # metrics.jsonl writes a non-finite number as null
        assert finite(gauges.get(name)), "step %d: %s = %r" % (l["step"], name, gauges.get(name))
# The gradient norm is measured (with or without clipping) and some step moved the weights.
norms = [l["roles"]["learner"]["gauges"]["learner.grad_norm"] for l in lines]
assert all(n >= 0 for n in norms) and max(norms) > 0, norms
s = json.load(open(run + "/summary.json"))
assert s["steps_completed"] == 4, s["steps_completed"]
for phase in ("before", "after"):
    for family, score in s[phase].items():
        assert finite(score["reward"]) and 0 <= score["success"] <= 1, (phase, family, score)
print("%s: loss %s, reward %s" % (objective, ["%.4f" % l["roles"]["learner"]["gauges"]["learner.loss"] for l in lines],
                                  ["%.3f" % l["roles"]["learner"]["gauges"]["learner.reward_mean"] for l in lines]))
PY
  read -r n total largest head <<<"$(moved "$FROZEN:latest" "$run/checkpoints:latest")"
  echo "$objective: $n of $total model arrays moved from the base (largest change $largest, output head moved: $head)"
  [ "${total:-0}" -gt 0 ] && [ $((2 * n)) -ge "$total" ] && [ "$head" = 1 ] ||
    fail "$objective: $n of ${total:-?} model arrays moved from the base (largest $largest), output head moved: ${head:-?}"
done

python3 - algos.json "$WORK/bench/algos.json" <<'PY' || { fail "bench algos reports"; sed 's/^/    | /' bench.txt; }
import json, math, sys
report, full = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert report["bench"] == "algos", report["bench"]
names = [c["name"] for c in report["cases"]]
assert names == ["grpo/seed1", "dr_grpo/seed1", "rloo/seed1", "ppo/seed1", "gspo/seed1", "grpo_turn/seed1"], names
runs = {r["objective"]: r for r in full["runs"]}
assert runs["ppo"]["advantage"] == "ppo" and runs["gspo"]["advantage"] == "grpo" and runs["gspo"]["gspo"], runs
assert runs["grpo_turn"]["credit"] == "turn" and runs["grpo"]["credit"] == "episode", runs
for name, r in runs.items():
    assert r["exit_status"] == 0 and r["steps_completed"] == 4, (name, r["exit_status"])
    assert r["gen_tokens_per_s"] > 0 and r["wall_s"] > 0, (name, r["gen_tokens_per_s"], r["wall_s"])
    assert set(r["before"]) == set(r["after"]) == {"arithmetic", "guess", "sort"}, (name, r["before"])
    assert len(r["rewards"]) == 4 and all(math.isfinite(x) for x in r["rewards"]), (name, r["rewards"])
PY
if "$PLOT_PYTHON" -c "import matplotlib" 2>/dev/null; then
  for png in curves "${OBJECTIVES[@]/#/curve_}"; do
    head -c 8 "$WORK/bench/$png.png" 2>/dev/null | grep -q PNG || fail "no learning-curve plot $png.png"
  done
else
  expect_contains bench.txt "matplotlib is not installed" "the bench says why there is no plot"
fi
# Without matplotlib the script says so with its own status (a stand-in
# package that fails to import hides an installed one).
mkdir -p nompl/matplotlib && echo 'raise ImportError("hidden by the test")' >nompl/matplotlib/__init__.py
PYTHONPATH=nompl "$PLOT_PYTHON" "$SOURCE_DIR/scripts/plot_curves.py" --out plots "grpo=$WORK/bench/algos-grpo-s1" >plot.txt 2>&1
expect_status 3 $? "plot_curves.py without matplotlib"
expect_contains plot.txt "matplotlib is not installed" "plot_curves.py names what is missing"
finish
