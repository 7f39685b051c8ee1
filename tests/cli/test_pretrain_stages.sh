# Pretraining in stages. `moerl pretrain --init FILE`: the second stage
# starts from the first one's weights (its first loss is the first stage's
# last loss, not a random model's), and a missing file is named. [pretrain]
# first_stage_families/steps: one command runs both stages and ends with the
# same weights as the two commands, and a family outside the mix is refused.
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

# The stages from the config: sort alone, then the whole mix; against the same two stages run by hand.
FIRST=(--set 'pretrain.first_stage_families=["sort"]' --set pretrain.first_stage_steps=20)
timeout 120 "$MOERL" pretrain --config "$CONFIG" "${TINY[@]}" "${STAGE[@]}" "${FIRST[@]}" --threads 1 \
  --set run.name=staged >staged.txt 2>&1
expect_status 0 $? "pretrain with a first stage"
expect_contains staged.txt "pretrain stage 1 of 2: sort, 20 steps" "the first stage is announced"
expect_contains staged.txt "pretrain stage 2 of 2: arithmetic, guess, sort, 30 steps" "the second stage is announced"
[ -f "$WORK/runs/staged/base.stage1.pt" ] || fail "the first stage's weights were not kept as base.stage1.pt"
timeout 120 "$MOERL" pretrain --config "$CONFIG" "${TINY[@]}" "${STAGE[@]}" --threads 1 --set run.name=hand1 \
  --set 'env.families=["sort"]' --set pretrain.steps=20 >hand1.txt 2>&1
expect_status 0 $? "the first stage by hand"
timeout 120 "$MOERL" pretrain --config "$CONFIG" "${TINY[@]}" "${STAGE[@]}" --threads 1 --set run.name=hand2 \
  --init "$WORK/runs/hand1/base.pt" >hand2.txt 2>&1
expect_status 0 $? "the second stage by hand"
python3 - staged.txt hand1.txt hand2.txt <<'PY' || fail "the configured stages did not train as the two commands do"
import re, sys
def stage_lines(path):
    return re.findall(r"pretrain: \d+ steps in \d+ s, (loss [0-9.]+ -> [0-9.]+, action-token accuracy [0-9.]+%)", open(path).read())
staged = stage_lines(sys.argv[1])
by_hand = stage_lines(sys.argv[2]) + stage_lines(sys.argv[3])
print("configured:", staged)
print("by hand:   ", by_hand)
# One thread each: the same demonstrations, weights and steps give the same numbers.
assert len(staged) == 2 and staged == by_hand
PY
timeout 60 "$MOERL" pretrain --config "$CONFIG" "${TINY[@]}" --set 'pretrain.first_stage_families=["lookup"]' \
  --set pretrain.first_stage_steps=5 --set run.name=outside >outside.txt 2>&1
expect_status 2 $? "a first-stage family outside env.families"
expect_contains outside.txt "pretrain.first_stage_families" "the key is named"
expect_contains outside.txt "'lookup' is not in env.families" "the family is named"
finish
