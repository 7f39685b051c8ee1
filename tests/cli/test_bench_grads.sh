# moerl bench grads --quick (the tiny policy) on 2 ranks through
# scripts/launch.sh, with buckets small enough that there are several: every
# number is finite, the three modes average the same gradient bytes, the
# overlapped averager cuts them into more than one bucket and starts some
# during the backward, and the flat one uses one buffer. A bad --bucket-mb
# and an unknown shape are errors that name the option at fault.
source "$(dirname "$0")/lib.sh" "$@"

run_job p2 180 "${LAUNCH[@]}" -n 2 bench grads --quick --bucket-mb 0.01 --out p2.json
expect_status 0 $? "bench grads on 2 ranks"
expect_contains p2.txt "hidden = (flat - overlapped)" "the summary table's reading"
python3 - p2.json <<'PY' || { fail "bench grads report"; sed 's/^/    | /' p2.txt; }
import json, math, sys
report = json.load(open(sys.argv[1]))
assert report["bench"] == "grads"
cases = {c["params"]["mode"]: c for c in report["cases"]}
assert sorted(cases) == ["compute", "flat", "overlapped"], list(cases)
for c in cases.values():
    numbers = list(c["metrics"].values()) + list(c.get("baseline", {}).values())
    numbers += [c["ratio"]] if c.get("ratio") is not None else []  # compute has no baseline
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers), c
    assert c["metrics"]["ms"] > 0 and c["params"]["ranks"] == 2, c
compute, flat, ovl = (cases[m]["metrics"] for m in ("compute", "flat", "overlapped"))
# Every parameter's gradient, whichever way it was averaged (or not).
assert compute["grad_MB"] > 0 and compute["grad_MB"] == flat["grad_MB"] == ovl["grad_MB"], (compute, flat, ovl)
assert flat["buckets"] == 1, flat
assert ovl["buckets"] > 1 and ovl["started_in_backward"] > 0, ovl
assert ovl["started_in_backward"] <= ovl["buckets"], ovl
assert ovl["wait_ms"] >= 0 and ovl["wait_ms"] <= ovl["average_ms"] + 1e-6, ovl
print("bench grads: %d buckets, %.1f started in the backward" % (ovl["buckets"], ovl["started_in_backward"]))
PY

"$MOERL" bench grads --quick --bucket-mb zero >bad.txt 2>&1
[ $? -ne 0 ] || fail "bench grads --bucket-mb zero succeeded"
expect_contains bad.txt "--bucket-mb: 'zero' is not a positive number" "the option at fault"
"$MOERL" bench grads --quick --shapes tiny,huge >bad_shape.txt 2>&1
[ $? -ne 0 ] || fail "bench grads --shapes tiny,huge succeeded"
expect_contains bad_shape.txt "unknown shape 'huge'" "the shape at fault"
finish
