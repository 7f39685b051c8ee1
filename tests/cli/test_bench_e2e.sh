# `moerl bench e2e` under mpirun on a tiny model: both phases run their steps
# in their own run directories (neither resumes the other; the synchronous one
# never trains on stale data), the report carries the async/sync ratio, the
# learner's time split and the weight-sync case with the model's real bytes,
# and the sync metrics reach the metrics file.
source "$(dirname "$0")/lib.sh" "$@"
CONFIG="$SOURCE_DIR/configs/quickstart.toml"
SMALL=("${TEST_TASKS[@]}" --set run.output_dir="$WORK/runs" --set model.d_model=32 --set model.num_heads=2 --set model.num_kv_heads=1
       --set model.num_layers=1 --set moe.d_expert=32 --set moe.num_experts=4 --set rollout.sessions_per_actor=8
       --set rollout.max_tokens_per_episode=256 --set algo.groups_per_step=2 --set cluster.message_timeout_s=30
       --set algo.drop_zero_variance_groups=false)

timeout 300 "${LAUNCH[@]}" -n 4 bench e2e --config "$CONFIG" "${SMALL[@]}" --steps 3 --out e2e.json \
  >e2e.txt 2>&1
expect_status 0 $? "bench e2e"
expect_contains e2e.txt "async_vs_sync" "report table"
for phase in async sync; do
  expect_contains e2e.txt "step 3/3 v3 |" "progress lines ($phase)"
  [ -f "$WORK/runs/quickstart-e2e-$phase/metrics.jsonl" ] || fail "no metrics file for the $phase phase"
done
python3 - e2e.json "$WORK/runs" <<'PY' || fail "bench e2e result"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bench"] == "e2e", r["bench"]
cases = {c["name"]: c for c in r["cases"]}
phase = cases["async_vs_sync"]
for side in (phase["metrics"], phase["baseline"]):
    assert side["steps_per_s"] > 0 and side["trained_tokens_per_s"] > 0, side
    assert side["update_s"] > 0 and side["learner_wait_s"] >= 0, side
    # The split adds up to the step (within rounding of the window).
    assert abs(side["update_s"] + side["publish_call_s"] + side["learner_wait_s"] - side["step_s"]) < 1e-6 * side["step_s"] or side["learner_wait_s"] == 0, side
assert phase["baseline"]["staleness_mean"] == 0, phase["baseline"]  # synchronous: always the current version
assert abs(phase["ratio"] / (phase["metrics"]["steps_per_s"] / phase["baseline"]["steps_per_s"]) - 1) < 1e-6
sync = cases["weight_sync"]
assert sync["params"]["bytes"] > 100000, sync  # the model's parameters, float32
assert sync["metrics"]["GB_per_s"] > 0 and sync["baseline"]["GB_per_s"] > 0, sync
# Each phase is its own run: 3 steps each, never continued from the other.
runs = sys.argv[2]
for name in ("quickstart-e2e-async", "quickstart-e2e-sync"):
    lines = [json.loads(l) for l in open(f"{runs}/{name}/metrics.jsonl")]
    assert [l["step"] for l in lines] == [1, 2, 3], (name, [l["step"] for l in lines])
    learner = lines[-1]["ranks"][0]
    assert learner["histograms"]["sync.publication_s"]["count"] >= 2, learner["histograms"].keys()
    assert learner["gauges"]["sync.publish_GB_per_s"] > 0, learner["gauges"]
    assert learner["gauges"]["sync.versions_in_flight"] >= 1, learner["gauges"]
PY
finish
