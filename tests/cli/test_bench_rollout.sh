# moerl bench rollout: decode tokens/s of the engine against full recompute,
# on random weights and, with --init, on a run's own policy (its
# architecture and weights from the file); a missing file is named.
source "$(dirname "$0")/lib.sh" "$@"
pretrain_tiny

"$MOERL" bench rollout --quick --out random.json >random.txt 2>&1
expect_status 0 $? "bench rollout (random weights)"
"$MOERL" bench rollout --quick --config "$CONFIG" "${TINY[@]}" --init "$TINY_BASE" --out init.json >init.txt 2>&1
expect_status 0 $? "bench rollout --init"
python3 - random.json init.json <<'PY' || fail "bench rollout: the cases"
import json, sys
random_cases = json.load(open(sys.argv[1]))["cases"]
init_cases = json.load(open(sys.argv[2]))["cases"]
assert random_cases and init_cases
for c in random_cases + init_cases:
    assert c["metrics"]["tokens_per_s"] > 0 and c["baseline"]["tokens_per_s"] > 0, c
assert all(c["params"]["d_model"] == 64 for c in random_cases), random_cases[0]["params"]
# TINY's architecture: d_model 32, 1 layer, 4 experts, read from the checkpoint's config.
for c in init_cases:
    p = c["params"]
    assert (p["d_model"], p["layers"], p["experts"]) == (32, 1, 4), p
PY
# --recompute 0: the engine alone, no baseline (what scripts/bench_peer.sh times).
"$MOERL" bench rollout --quick --recompute 0 --out engine.json >engine.txt 2>&1
expect_status 0 $? "bench rollout --recompute 0"
python3 - engine.json <<'PY' || fail "bench rollout --recompute 0: the cases"
import json, sys
cases = json.load(open(sys.argv[1]))["cases"]
assert cases and all(c["metrics"]["tokens_per_s"] > 0 and not c.get("baseline") for c in cases), cases
PY
"$MOERL" bench rollout --quick --init "$WORK/no-such.pt" >missing.txt 2>&1
[ $? -ne 0 ] || fail "bench rollout --init of a missing file succeeded"
expect_contains missing.txt "no-such.pt" "bench rollout: the missing file named"
finish
