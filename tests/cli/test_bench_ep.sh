# moerl bench ep --quick on 1 and 2 ranks through scripts/launch.sh: at P=2
# a rank sends and receives all-to-all bytes near what the cost model
# predicts, holds half of P=1's expert bytes and half the experts; at P=1
# nothing leaves the rank; every number is finite and the whole layer's
# baseline is the same at both sizes. Ranks that do not divide the experts
# and a bad --tokens are errors that say so.
source "$(dirname "$0")/lib.sh" "$@"

run_job p1 120 "${LAUNCH[@]}" -n 1 bench ep --quick --out p1.json
expect_status 0 $? "bench ep on 1 rank"
run_job p2 120 "${LAUNCH[@]}" -n 2 bench ep --quick --out p2.json
expect_status 0 $? "bench ep on 2 ranks"
expect_contains p2.txt "whole/split" "the summary table"
expect_count p2.txt "bench ep" 1 "only rank 0 reports"
python3 - p1.json p2.json <<'PY' || { fail "bench ep reports"; sed 's/^/    | /' p2.txt; }
import json, math, sys
one, two = (json.load(open(path)) for path in sys.argv[1:3])
assert one["bench"] == two["bench"] == "ep"
assert len(one["cases"]) == len(two["cases"]) >= 1
for c in one["cases"] + two["cases"]:
    numbers = list(c["metrics"].values()) + list(c["baseline"].values()) + [c["ratio"]]
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers), c
    assert c["metrics"]["ms"] > 0 and c["baseline"]["ms"] > 0 and c["ratio"] > 0, c
    assert c["metrics"]["exchanges"] == 4, c  # dispatch and combine, forward and backward
for a, b in zip(one["cases"], two["cases"]):
    pa, pb, ma, mb = a["params"], b["params"], a["metrics"], b["metrics"]
    assert (pa["ranks"], pb["ranks"]) == (1, 2), (pa, pb)
    assert pb["experts_per_rank"] * 2 == pa["experts_per_rank"] == pa["experts"], (pa, pb)
    # Nothing leaves a lone rank; two ranks exchange about what the model says.
    assert ma["sent_MB"] == ma["received_MB"] == ma["model_sent_MB"] == 0, ma
    assert mb["sent_MB"] > 0 and mb["received_MB"] > 0, mb
    assert 0.5 < mb["sent_MB"] / mb["model_sent_MB"] < 1.5, mb
    # Expert memory per rank: 1/P of the whole layer's, which P does not change.
    assert a["baseline"]["expert_MB"] == b["baseline"]["expert_MB"] == ma["expert_MB"], (a, b)
    assert abs(mb["expert_MB"] * 2 - ma["expert_MB"]) < 1e-9, (ma, mb)
print("bench ep: P=1 and P=2 reports agree with the cost model")
PY

run_job p3 120 "${LAUNCH[@]}" -n 3 bench ep --quick
[ $? -ne 0 ] || fail "bench ep on 3 ranks for 8 experts succeeded"
expect_contains p3.txt "3 ranks do not divide the 8 experts" "the ranks at fault"
"$MOERL" bench ep --quick --tokens zero >bad.txt 2>&1
[ $? -ne 0 ] || fail "bench ep --tokens zero succeeded"
expect_contains bad.txt "--tokens" "the option at fault"
finish
