# moerl pretrain --init FILE: pretraining in stages. The second stage starts
# from the first one's weights (its first loss is the first stage's last
# loss, not a random model's), and a missing file is named.
source "$(dirname "$0")/lib.sh" "$@"
STAGE=(--set pretrain.steps=30 --set pretrain.lr=3e-3)
timeout 120 "$MOERL" pretrain --config "$CONFIG" "${TINY[@]}" "${STAGE[@]}" --set run.name=first >first.txt 2>&1
expect_status 0 $? "first stage"
timeout 120 "$MOERL" pretrain --config "$CONFIG" "${TINY[@]}" "${STAGE[@]}" --set run.name=second \
  --init "$WORK/runs/first/base.pt" >second.txt 2>&1
expect_status 0 $? "second stage"
expect_contains second.txt "continuing from $WORK/runs/first/base.pt" "the second stage says where it starts"
python3 - first.txt second.txt <<'PY' || fail "the second stage did not start where the first ended"
import re, sys
def losses(path):
    m = re.search(r"loss ([0-9.]+) -> ([0-9.]+)", open(path).read())
    return float(m.group(1)), float(m.group(2))
first_start, first_end = losses(sys.argv[1])
second_start, _ = losses(sys.argv[2])
print(f"first stage {first_start:.3f} -> {first_end:.3f}; second stage starts at {second_start:.3f}")
# A random model starts near ln(vocabulary); the loaded one near where the first stage ended.
assert first_end < first_start - 0.5, (first_start, first_end)
assert abs(second_start - first_end) < abs(second_start - first_start), (first_start, first_end, second_start)
PY
timeout 60 "$MOERL" pretrain --config "$CONFIG" "${TINY[@]}" --set run.name=third --init "$WORK/no_such.pt" >missing.txt 2>&1
status=$?
[ "$status" = 0 ] && fail "pretrain --init with a missing file succeeded"
expect_contains missing.txt "no_such.pt" "the missing file is named"
finish
