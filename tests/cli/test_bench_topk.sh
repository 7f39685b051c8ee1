# `moerl bench topk --quick` on a tiny pretrained model (4 experts, top-2):
# the trade-off table has one row per k (the model's own k added to --k as
# the baseline), its numbers are finite, the baseline row's ratios are 1.00
# and its success difference +0.0; the JSON report agrees; bad --k values
# are errors naming the option.
source "$(dirname "$0")/lib.sh" "$@"
pretrain_tiny
timeout 240 "$MOERL" bench topk --quick --config "$CONFIG" "${TINY[@]}" --init "$TINY_BASE" --k 1,4 \
  --out topk.json >bench.txt 2>&1
expect_status 0 $? "bench topk"
expect_contains bench.txt "trained with moe.top_k = 2 (the baseline of every ratio)" "the header names the baseline"
expect_contains bench.txt "4 episodes per family on the same seeds for every k" "the header names the episodes"
python3 - bench.txt topk.json <<'PY' || { fail "bench topk table and report"; sed 's/^/    | /' bench.txt; }
import json, math, sys
lines = open(sys.argv[1]).read().splitlines()
head = next(i for i, l in enumerate(lines) if l.split()[:2] == ["k", "tokens/s"])
assert lines[head].split()[9:] == ["arithmetic", "guess", "sort", "mean", "d", "mean", "+-95%"], lines[head]
rows = [l.split() for l in lines[head + 1:head + 4]]
assert [r[0] for r in rows] == ["1", "2", "4"], rows
for r in rows:
    assert len(r) == 13, r
    numbers = [float(c.rstrip("%")) for c in r[1:]]
    assert all(math.isfinite(v) for v in numbers), r
    assert numbers[0] > 0 and numbers[2] > 0 and numbers[4] > 0, r  # tokens/s, p50 and p99 ms
    assert all(0 <= v <= 100 for v in numbers[6:10]), r  # success percentages
    assert numbers[11] >= 0, r  # the interval's half-width
base = rows[1]
assert base[2] == base[4] == base[6] == "1.00", base
assert base[11] == "+0.0" and base[12] == "0.0", base
report = json.load(open(sys.argv[2]))
assert report["bench"] == "topk", report["bench"]
cases = {c["name"]: c for c in report["cases"]}
assert list(cases) == ["k=1", "k=2", "k=4"], list(cases)
for name, c in cases.items():
    m = c["metrics"]
    own = {"tokens_per_s", "p50_step_ms", "p99_step_ms", "success_mean",
           "success_arithmetic", "success_guess", "success_sort"}
    assert set(m) == own | {"success_mean_gap", "success_mean_gap_ci95"}, m
    assert all(math.isfinite(v) for v in m.values()), m
    assert c["baseline"] == {k: v for k, v in cases["k=2"]["metrics"].items() if k in own}, c
    mean = sum(m["success_" + f] for f in ("arithmetic", "guess", "sort")) / 3
    assert abs(m["success_mean"] - mean) < 1e-12, m
    assert abs(m["success_mean_gap"] - (m["success_mean"] - c["baseline"]["success_mean"])) < 1e-12, m
    assert c["params"]["model_top_k"] == 2 and c["params"]["experts"] == 4, c["params"]
    assert c["params"]["k"] == int(name[2:]), c["params"]
assert cases["k=2"]["ratio"] == 1.0, cases["k=2"]
assert cases["k=2"]["metrics"]["success_mean_gap"] == 0 and cases["k=2"]["metrics"]["success_mean_gap_ci95"] == 0
PY

"$MOERL" bench topk --quick --config "$CONFIG" "${TINY[@]}" --k 1,5 >bad.txt 2>&1
expect_status 1 $? "a k beyond the experts"
expect_contains bad.txt "bench topk: --k 5 must be in [1, moe.num_experts = 4]" "the error names --k and the bound"
"$MOERL" bench topk --quick --config "$CONFIG" "${TINY[@]}" --k 1,two >bad.txt 2>&1
expect_status 1 $? "a k that is not a number"
expect_contains bad.txt "bench topk: --k: 'two' is not a whole number" "the error names --k and the value"
finish
