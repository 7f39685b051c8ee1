# Every subcommand has help; --version names the build; bench writes the
# shared JSON format; eval needs a config.
source "$(dirname "$0")/lib.sh" "$@"

"$MOERL" --version >out.txt 2>&1
expect_status 0 $? "--version"
expect_contains out.txt "moerl 0." "version text"
expect_contains out.txt "LibTorch" "version names LibTorch"
for cmd in train eval config checkpoint bench; do
  "$MOERL" "$cmd" --help >out.txt 2>&1
  expect_status 0 $? "$cmd --help"
  expect_contains out.txt "Usage" "$cmd --help"
done
"$MOERL" eval >out.txt 2>&1
[ $? -ne 0 ] || fail "eval without --config must fail"
expect_contains out.txt "--config" "eval names the missing option"

"$MOERL" bench --list >out.txt 2>&1
expect_status 0 $? "bench --list"
expect_contains out.txt "messages" "bench list"
"$MOERL" bench messages --quick --out result.json >out.txt 2>&1
expect_status 0 $? "bench messages"
expect_contains out.txt "frame+validate" "bench table"
python3 - result.json <<'PY' || fail "bench JSON format"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["bench"] == "messages"
assert "hostname" in r["host"] and "cores" in r["host"]
for c in r["cases"]:
    assert set(c) >= {"name", "params", "metrics", "baseline", "ratio"}, c
    assert c["ratio"] > 0
PY
"$MOERL" bench nosuch >out.txt 2>&1
expect_status 2 $? "unknown benchmark"
"$MOERL" config reference >out.txt 2>&1
expect_contains out.txt "| \`top_k\` | integer | \`2\` |" "reference table"
# config get: plain values for scripts.
[ "$("$MOERL" config get "$SOURCE_DIR/configs/quickstart.toml" run.directory --set run.name=x)" = "runs/x" ] \
  || fail "config get run.directory"
[ "$("$MOERL" config get "$SOURCE_DIR/configs/quickstart.toml" cluster.ranks)" = "4" ] || fail "config get cluster.ranks"
"$MOERL" config get "$SOURCE_DIR/configs/quickstart.toml" model.nope >out.txt 2>&1
expect_status 2 $? "config get of an unknown key"

"$MOERL" config reference >reference.md 2>&1
diff -u "$SOURCE_DIR/docs/config.md" reference.md >/dev/null \
  || fail "docs/config.md is out of date: regenerate with moerl config reference > docs/config.md"
finish
