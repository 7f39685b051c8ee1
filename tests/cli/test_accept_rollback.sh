# Held-out evaluation during training ([eval] every_steps), `moerl checkpoint
# accept` and [eval] auto_rollback, on real jobs:
#   1. a 30-step job evaluates every 5 steps (a round still out when the next
#      is due delays that one: this tiny job steps faster than it evaluates):
#      each evaluated version gets vNNNNNN.eval.json beside its checkpoint (the
#      base: base.eval.json), the log says so, the metrics carry the eval.*
#      gauges;
#   2. accept passes for the first evaluated version A (nothing below the
#      base, latencies and expert load within the limits, no refused
#      publication) and tags it stable (checkpoint list shows it with its
#      held-out success); accept fails for the second, B, when
#      its environment P99 limit is set below what the run measured, naming
#      that check, and stable stays A; the last version (no periodic
#      evaluation) and a directory that is no run are refused;
#   3. the job resumes with auto_rollback; stable A's record is replaced by
#      one of a far better policy (8 of 8 per family, what an accepted good
#      version would hold), so every later evaluation of this tiny policy is
#      below it beyond the interval: after rollback_after = 2 of them the job
#      moves `latest` to A, the learners load it, and the job still finishes.
source "$(dirname "$0")/lib.sh" "$@"
pretrain_tiny
EVAL=(--set env.shaping=shaped --set eval.every_steps=5 --set checkpoint.every_steps=5 --set eval.episodes=8
      --set rollout.eval_greedy=false --set checkpoint.keep_last=50)
STORE="$WORK/runs/acc/checkpoints"

# 1. Periodic evaluation.
run_job first 240 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" "${EVAL[@]}" --set run.name=acc \
  --set optim.total_steps=30 --init "$TINY_BASE"
expect_status 0 $? "first job"
[ -s "$STORE/base.eval.json" ] || fail "no base.eval.json"
evaluated=($(cd "$STORE" && ls v*.eval.json 2>/dev/null | sed 's/^v0*\([0-9][0-9]*\)\.eval\.json$/\1/' | sort -n))
echo "evaluated versions: ${evaluated[*]}"
[ ${#evaluated[@]} -ge 2 ] || { fail "fewer than 2 periodic evaluations were recorded: ${evaluated[*]}"; finish; }
A=${evaluated[0]}
B=${evaluated[1]}
for v in "${evaluated[@]}"; do
  [ $((v % 5)) = 0 ] && [ "$v" -lt 30 ] || fail "an evaluation of v$v: not a multiple of 5 before the last step"
  expect_contains first.txt "evaluation of version $v (played by versions" "the log names the evaluation of v$v"
done
python3 - "$STORE" "$WORK/runs/acc/metrics.jsonl" "$A" <<'PY' || fail "evaluation records and gauges"
import json, sys
store, metrics, a = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = json.load(open(f"{store}/v{a:06d}.eval.json"))
assert r["version"] == a, r
lo, hi = r["versions_played"]
assert a <= lo <= hi, r["versions_played"]
assert set(r["sampled"]) == {"arithmetic", "guess", "sort"}, r["sampled"].keys()
for family, s in r["sampled"].items():
    assert s["episodes"] + s["env_failures"] == 8, (family, s)
    assert 0 <= s["ci_low"] <= s["success"] <= s["ci_high"] <= 1, (family, s)
gauges = {}
for line in open(metrics):
    for rank in json.loads(line)["ranks"]:
        gauges.update(rank.get("gauges", {}))
for family in ("arithmetic", "guess", "sort"):
    for key in ("success", "success_ci_low", "success_ci_high"):
        assert f"eval.{family}.sampled.{key}" in gauges, (family, key, sorted(g for g in gauges if g.startswith("eval")))
print("records and gauges ok")
PY

# 2. Acceptance.
LA=$(printf "v%06d" "$A")
"$MOERL" checkpoint accept "$WORK/runs/acc" "$A" >acceptA.txt 2>&1
expect_status 0 $? "accept $LA"
expect_contains acceptA.txt "accepted: $LA is tagged stable" "accept $LA"
for check in "held-out success" "environment step P99" "weight-version mismatches" "expert load imbalance"; do
  expect_contains acceptA.txt "$check" "accept's table shows '$check'"
done
"$MOERL" checkpoint list "$STORE" >list.txt 2>&1
grep -E "^ *$LA .*stable" list.txt >/dev/null || { fail "checkpoint list does not show $LA as stable"; sed 's/^/    | /' list.txt; }
python3 - "$STORE/$LA.eval.json" list.txt "$LA" <<'PY' || { fail "checkpoint list: held-out success of $LA"; sed 's/^/    | /' list.txt; }
import json, sys
record, listing, label = json.load(open(sys.argv[1])), open(sys.argv[2]).read().splitlines(), sys.argv[3]
[line] = [l for l in listing if l.split()[:1] == [label]]
for family, s in record["sampled"].items():
    shown = f"{family}={int(100 * s['success'] + 0.5)}%"
    assert shown in line, (shown, line)
PY
"$MOERL" checkpoint accept "$WORK/runs/acc" "$B" --max-env-p99-s 0.000001 >acceptB.txt 2>&1
expect_status 1 $? "accept v$B over its P99 limit"
grep -E "environment step P99 .* FAIL" acceptB.txt >/dev/null || { fail "accept v$B: the P99 row does not fail"; sed 's/^/    | /' acceptB.txt; }
expect_contains acceptB.txt "not accepted: 1 check(s) failed; \`stable\` stays $LA" "accept v$B refused"
"$MOERL" checkpoint accept "$WORK/runs/acc" 30 >accept30.txt 2>&1
expect_status 1 $? "accept v30 (the last step: no periodic evaluation)"
expect_contains accept30.txt "no evaluation of v000030" "accept v30 names the missing evaluation"
"$MOERL" checkpoint accept "$WORK" "$A" >accept_bad.txt 2>&1
expect_status 2 $? "accept in a directory that is no run"
expect_contains accept_bad.txt "$WORK is not a run directory" "the bad directory is named"

# 3. Automatic rollback to stable.
python3 - "$STORE/$LA.eval.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for s in r["sampled"].values():
    s.update(episodes=8, successes=8, success=1.0, ci_low=0.676, ci_high=1.0, env_failures=0)
json.dump(r, open(sys.argv[1], "w"))
PY
run_job second 300 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" "${EVAL[@]}" --set run.name=acc \
  --set optim.total_steps=100 --set eval.auto_rollback=true --set eval.rollback_after=2 --resume auto
expect_status 0 $? "resumed job with auto_rollback"
expect_contains second.txt "is below stable v$A beyond the 95% interval (1 in a row)" "the first regression is logged"
expect_contains second.txt "is below stable v$A beyond the 95% interval (2 in a row)" "the second regression is logged"
expect_contains second.txt "auto_rollback: 2 evaluations in a row regressed; \`latest\` moved to stable v$A" "auto_rollback acts"
expect_contains second.txt "rollback: \`latest\` was moved to v$A" "the learners load stable"
expect_contains second.txt "step 100/100 " "the job finishes"
finish
