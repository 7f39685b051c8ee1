# `moerl bench faults` on a tiny model, two cases: the run without faults and
# "kill actor 0": both finish every step, the kill is detected and recovered
# in place with no step or session lost, and the report (JSON) carries the table's
# columns and the reward ratio's baseline. 48 steps, not --quick's 16: ranks
# learn the job's step from learner 0's beat (once a second), and once
# rollouts got faster 16 tiny steps took under 2 s, so the job could end
# before the kill planned at step 4 was due or detected (failed in a clean
# clone); at step 12 of 48 it leaves seconds for both.
source "$(dirname "$0")/lib.sh" "$@"
needs_ulfm
pretrain_tiny
timeout 240 env MOERL_BIN="$MOERL" "$MOERL" bench faults --quick --steps 48 --only kill_actor --dir "$WORK/bench" \
  --init "$TINY_BASE" "${TINY[@]}" --out faults.json >bench.txt 2>&1
expect_status 0 $? "bench faults"
expect_contains bench.txt "kill_actor" "the table names the case"
python3 - faults.json <<'PY' || { fail "bench faults report"; sed 's/^/    | /' bench.txt; }
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bench"] == "faults", r["bench"]
cases = {c["name"]: c for c in r["cases"]}
assert set(cases) == {"none", "kill_actor"}, set(cases)
none, kill = cases["none"]["metrics"], cases["kill_actor"]["metrics"]
for m in (none, kill):
    assert m["steps_completed"] == 48 and m["restarts"] == 0 and m["steps_lost"] == 0, m
assert none["detected_after_s"] == -1 and none["episodes_restarted"] == 0, none
assert 0 <= kill["detected_after_s"] < 5 and 0 <= kill["recovered_after_s"] < 10, kill
# No episodes_restarted > 0: an actor that had delivered every group it was
# given (waiting for the next weights) leaves nothing to restart, which fast
# rollouts made common.
assert kill["episodes_restarted"] >= 0 and kill["sessions_lost"] == 0, kill
assert cases["kill_actor"]["baseline"]["wall_s"] == none["wall_s"], cases["kill_actor"]
assert cases["kill_actor"]["params"]["plan"] == "kill actor 0 at step 12", cases["kill_actor"]["params"]
PY
finish
