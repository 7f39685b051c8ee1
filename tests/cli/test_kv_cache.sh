# rollout.kv_cache_dtype (model/kv_cache.h, docs/tuning.md):
#   - a job whose actors keep an int8 KV cache trains every step, with a
#     finite behaviour/learner log-prob gap the learner reports;
#   - a value other than float32/int8 is a configuration error naming the key;
#   - moerl bench kv measures int8 against float32 on the same sequences:
#     (head_dim + 4) / (4 head_dim) of the bytes, a small finite gap.
source "$(dirname "$0")/lib.sh" "$@"
pretrain_tiny

"${LAUNCH[@]}" -n 4 train --config "$CONFIG" "${TINY[@]}" --set run.name=int8 --set optim.total_steps=4 \
  --set rollout.kv_cache_dtype=int8 --set telemetry.per_rank_log_files=true --init "$TINY_BASE" >int8.txt 2>&1 </dev/null
expect_status 0 $? "train with an int8 KV cache"
expect_contains int8.txt "step 4/4 v4 |" "int8: every step"
cat "$WORK"/runs/int8/logs/rank-*.log >ranks.txt 2>/dev/null
expect_count ranks.txt "KV cache int8" 2 "int8: both actors say so"
python3 - int8.txt <<'PY' || fail "int8: the log-prob gap"
import re, sys
gaps = [float(g) for g in re.findall(r"\|logp gap\| ([0-9.eE+-]+|nan|inf)", open(sys.argv[1]).read())]
assert len(gaps) >= 4, gaps
assert all(g == g and g < 1.0 for g in gaps), gaps
PY

"$MOERL" config check "$CONFIG" --set rollout.kv_cache_dtype=int4 >bad.txt 2>&1
expect_status 2 $? "kv_cache_dtype=int4"
expect_contains bad.txt "kv_cache_dtype" "kv_cache_dtype=int4: the key named"

"$MOERL" bench kv --quick --config "$CONFIG" "${TINY[@]}" --init "$TINY_BASE" --out kv.json >kv.txt 2>&1
expect_status 0 $? "bench kv"
python3 - kv.json <<'PY' || { fail "bench kv: bytes and gap"; sed 's/^/    | /' kv.txt; }
import json, sys
cases = json.load(open(sys.argv[1]))["cases"]
assert cases, "no cases"
for c in cases:
    m, b = c["metrics"], c["baseline"]
    head_dim = 32 // 2  # TINY: d_model 32, 2 heads
    assert abs(m["kv_bytes_per_token"] / b["kv_bytes_per_token"] - (head_dim + 4) / (4 * head_dim)) < 1e-9, (m, b)
    assert 0 < m["logp_gap_mean"] < 0.1, m
    assert b["logp_gap_max"] < 1e-3, b
    assert m["decode_tok_per_s"] > 0 and b["decode_tok_per_s"] > 0
PY
finish
