# scripts/bench_peer.sh at a tiny size: moerl's side always; the peer side
# (PyTorch + transformers) when its virtual environment exists (installing it
# costs minutes and GBs, so this test never does). Checks the table: every
# measure present (decode, MoE layer, GRPO update), and with the peer side every row has both sides and a
# positive, finite ratio.
source "$(dirname "$0")/lib.sh" "$@"
export MOERL_BIN="$MOERL"
peer=0
if [ -x "$SOURCE_DIR/.venv/bin/python" ] && cmp -s "$SOURCE_DIR/benchmarks/peer/requirements.txt" "$SOURCE_DIR/.venv/requirements.txt"; then
  peer=1
  run_job peer 280 "$SOURCE_DIR/scripts/bench_peer.sh" --tiny --rounds 1 --threads 1 --out "$WORK/table.json"
else
  echo "the peer side is skipped: no .venv/ (scripts/bench_peer.sh --install creates it); moerl's side only"
  run_job peer 200 "$SOURCE_DIR/scripts/bench_peer.sh" --tiny --rounds 1 --threads "1 2" --moerl-only --out "$WORK/table.json"
fi
expect_status 0 $? "scripts/bench_peer.sh --tiny"
expect_contains peer.txt "exported v000001 as MixtralForCausalLM" "the model both sides use"
expect_contains peer.txt "BLAS: " "the BLAS named"
[ "$peer" = 1 ] || expect_contains peer.txt "the peer side was skipped (--moerl-only)" "a skipped side is said"
python3 - "$WORK/table.json" "$peer" <<'PY' || fail "the table"
import json, math, sys
rows = json.load(open(sys.argv[1]))["rows"]
peer = sys.argv[2] == "1"
decode = [r for r in rows if r["measure"].startswith("decode tokens/s")]
moe = [r for r in rows if r["measure"].startswith("MoE layer")]
update = [r for r in rows if r["measure"].startswith("GRPO update tokens/s")]
assert len(decode) >= 2 and len(moe) >= 2 and len(update) >= 1, [r["measure"] for r in rows]
for r in rows:
    assert r["moerl"] and r["moerl"]["median"] > 0, r
    if peer:
        assert r["peer"] and r["peer"]["median"] > 0, r
        assert r["ratio"] is not None and math.isfinite(r["ratio"]) and r["ratio"] > 0, r
    else:
        assert r["peer"] is None and r["ratio"] is None, r
print(len(rows), "rows, peer side", "run" if peer else "skipped")
PY
# Bad input is named.
"$SOURCE_DIR/scripts/bench_peer.sh" --rounds zero >bad.txt 2>&1
expect_status 2 $? "--rounds zero"
expect_contains bad.txt "--rounds needs a positive number" "the option at fault"
"$SOURCE_DIR/scripts/bench_peer.sh" --tiny --moerl-only --checkpoint "$WORK/nowhere:1" >bad.txt 2>&1
expect_status 1 $? "a checkpoint that is not there"
expect_contains bad.txt "export-hf of $WORK/nowhere:1 failed" "the checkpoint at fault"
finish
