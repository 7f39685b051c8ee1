# `moerl checkpoint list|verify|tag|rollback|export|prune` and scripts/rollback.sh
# against a store the test writes with the hidden `checkpoint write-sample`.
source "$(dirname "$0")/lib.sh" "$@"


RUN="$WORK/run"
CKPT="$RUN/checkpoints"
for v in 1 2 3; do
  "$MOERL" checkpoint write-sample "$CKPT" "$v" --shards 2 >out.txt 2>&1
  expect_status 0 $? "write-sample $v"
done
"$MOERL" checkpoint list "$CKPT" >out.txt 2>&1
expect_status 0 $? "list"
expect_count out.txt " valid " 3 "three valid versions"
expect_contains out.txt "v000003   30 " "step of v3"
expect_contains out.txt "reward_mean=0.15" "metrics at save"
expect_contains out.txt "latest: v000003" "latest"
"$MOERL" checkpoint verify "$CKPT" >out.txt 2>&1
expect_status 0 $? "verify all"
expect_count out.txt ": valid" 3 "verify all"

"$MOERL" checkpoint tag "$CKPT" 1 good >out.txt 2>&1
expect_status 0 $? "tag"
"$MOERL" checkpoint tag "$CKPT" 1 42 >out.txt 2>&1
expect_status 1 $? "numeric tag refused"
expect_contains out.txt "invalid tag name" "numeric tag refused"
"$MOERL" checkpoint list "$CKPT" >out.txt 2>&1
expect_contains out.txt "good" "tag listed"

# Damage v3: the truncated shard is named; rollback refuses it; --previous skips nothing older.
truncate -s 2000 "$CKPT/v000003.rank1.h5"
"$MOERL" checkpoint verify "$CKPT" 3 >out.txt 2>&1
expect_status 1 $? "verify corrupt"
expect_contains out.txt "v000003.rank1.h5" "corrupt shard named"
expect_contains out.txt "truncated" "truncation said"
"$MOERL" checkpoint list "$CKPT" >out.txt 2>&1
expect_contains out.txt "INVALID" "list marks invalid"
"$MOERL" checkpoint rollback "$CKPT" --to 3 >out.txt 2>&1
expect_status 1 $? "rollback to corrupt"
expect_contains out.txt "refusing to roll back to v000003" "rollback refused"
"$MOERL" checkpoint rollback "$CKPT" >out.txt 2>&1
expect_status 2 $? "rollback without a target"

MOERL="$MOERL" bash "$SOURCE_DIR/scripts/rollback.sh" "$RUN" >out.txt 2>&1
expect_status 0 $? "scripts/rollback.sh"
expect_contains out.txt "latest: v000003 -> v000002" "rollback.sh moves latest"
expect_contains "$CKPT/latest" "v000002" "latest file"
"$MOERL" checkpoint rollback "$CKPT" --to good >out.txt 2>&1
expect_status 0 $? "rollback to tag"
expect_contains "$CKPT/latest" "v000001" "latest at the tag"
"$MOERL" checkpoint rollback "$CKPT" --previous >out.txt 2>&1
expect_status 1 $? "nothing older than v1"

"$MOERL" checkpoint export "$CKPT" good weights.h5 >out.txt 2>&1
expect_status 0 $? "export"
[ -s weights.h5 ] || fail "export wrote no file"
if command -v h5ls >/dev/null; then
  h5ls -r weights.h5 >out.txt 2>&1
  expect_contains out.txt "/model/shard1/experts.w1" "exported weights"
  grep -q optimizer out.txt && fail "export holds optimizer state"
fi
"$MOERL" checkpoint export "$CKPT" nosuch weights2.h5 >out.txt 2>&1
expect_status 1 $? "export unknown tag"

# A save killed before `latest` moves: the store still points at the old version.
MOERL_CHECKPOINT_FAULT=before-index:exit "$MOERL" checkpoint write-sample "$CKPT" 4 >out.txt 2>&1
expect_status 86 $? "crash before the index"
expect_contains "$CKPT/latest" "v000001" "latest unchanged after a crash"
"$MOERL" checkpoint verify "$CKPT" 4 >out.txt 2>&1
expect_status 1 $? "crashed version is incomplete"
expect_contains out.txt "incomplete" "incomplete said"

# Retention keeps the newest version, the tagged one and latest (v1); the
# crashed v4 is a leftover once a newer version is complete.
"$MOERL" checkpoint write-sample "$CKPT" 5 --no-latest >out.txt 2>&1
expect_status 0 $? "write-sample without moving latest"
expect_contains "$CKPT/latest" "v000001" "--no-latest"
"$MOERL" checkpoint prune "$CKPT" --keep 1 >out.txt 2>&1
expect_status 0 $? "prune"
expect_contains out.txt "deleted v000002" "prune deletes untagged"
expect_contains out.txt "deleted v000003" "prune deletes the corrupt one"
expect_contains out.txt "removed leftover v000004 (incomplete)" "prune removes the crashed save"
[ -e "$CKPT/v000005.index.json" ] || fail "prune deleted the newest version"
[ -e "$CKPT/v000001.index.json" ] || fail "prune deleted the tagged version"

"$MOERL" checkpoint list "$WORK/nowhere" >out.txt 2>&1
expect_status 2 $? "missing directory"
expect_contains out.txt "does not exist" "missing directory said"
# A store written by moerl before its CRC-32C moved to ISA-L (tests/fixtures/
# checkpoint_crc32c_v1: a 1-step job of a tiny model, 2 Dec 2026 code): every
# array's stored checksum still matches, and its weights export.
OLD="$WORK/old_store"
cp -r "$SOURCE_DIR/tests/fixtures/checkpoint_crc32c_v1" "$OLD"
"$MOERL" checkpoint verify "$OLD" >out.txt 2>&1
expect_status 0 $? "verify the store written before ISA-L"
expect_contains out.txt "v000001: valid (47.3 KiB of arrays checked)" "its checksums match"
"$MOERL" checkpoint export "$OLD" 1 "$WORK/old.h5" >out.txt 2>&1
expect_status 0 $? "export the store written before ISA-L"
[ -s "$WORK/old.h5" ] || fail "no export of the old store"
# One flipped byte in a dataset of that file is found (the check can fail).
python3 - "$OLD/v000001.rank0.h5" <<'PY'
import sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
data[len(data) // 2] ^= 0x10
open(path, "wb").write(bytes(data))
PY
"$MOERL" checkpoint verify "$OLD" >out.txt 2>&1
expect_status 1 $? "verify the damaged old store"
expect_contains out.txt "checksum mismatch" "the damaged old store: the array named"
finish
