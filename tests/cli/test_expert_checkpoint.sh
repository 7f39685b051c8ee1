# Sharded checkpoints across layouts: one policy saved at expert-parallel 2
# (two shards, each with half the experts) and unsplit (one shard) by the
# MPI test binary's hidden probe. export-hf of the sharded version must
# write the same files as export-hf of the unsplit one, `checkpoint diff`
# must call them identical (saying the layouts differ), and list, verify and
# export must work on the sharded version.
source "$(dirname "$0")/lib.sh" "$@"
if [ -z "${MOERL_MPI_TESTS:-}" ] || [ ! -x "$MOERL_MPI_TESTS" ]; then
  echo "skipped: MOERL_MPI_TESTS (the moerl_mpi_tests binary) is not set"
  exit 77
fi
FIXTURE="$SOURCE_DIR/tests/parity/fixtures/qwen2_moe"
printf '[model]\nsource = "hf:%s"\n' "$FIXTURE" > run.toml

run_job probe 120 env MOERL_EP_PROBE_CONFIG="$WORK/run.toml" MOERL_EP_PROBE_OUT="$WORK" \
  "${MOERL_MPIEXEC:-mpirun}" -n 2 --oversubscribe --allow-run-as-root "$MOERL_MPI_TESTS" "[ep_checkpoint_probe]"
expect_status 0 $? "the probe saves both layouts"
[ -f split/v000001.rank1.h5 ] || fail "the split version has a shard per member: $(ls split 2>&1)"
[ -f split/v000001.rank2.h5 ] && fail "the split version has more shards than members"
[ -f whole/v000001.rank1.h5 ] && fail "the unsplit version has one shard"

"$MOERL" checkpoint verify split >out.txt 2>&1
expect_status 0 $? "verify the sharded version"
"$MOERL" checkpoint list split >out.txt 2>&1
expect_status 0 $? "list the sharded version"
expect_contains out.txt " valid " "the sharded version is valid"

"$MOERL" checkpoint export-hf whole 1 hf_whole >out.txt 2>&1
expect_status 0 $? "export-hf of the unsplit version"
"$MOERL" checkpoint export-hf split 1 hf_split >out.txt 2>&1
expect_status 0 $? "export-hf of the sharded version"
expect_contains out.txt "as Qwen2MoeForCausalLM" "export-hf names the architecture"
diff -r hf_whole hf_split >hfdiff.txt 2>&1 || fail "export-hf differs across layouts: $(head -5 hfdiff.txt)"
[ "$(ls hf_split/*.safetensors | wc -l)" -ge 1 ] || fail "export-hf wrote no weights"

"$MOERL" checkpoint diff split whole >diff.txt 2>&1
expect_status 0 $? "diff across layouts"
expect_contains diff.txt "are identical" "the same weights in two layouts"
expect_contains diff.txt "layouts differ" "the diff names the layouts"
expect_contains diff.txt "expert-parallel 2 (experts [0, 2) [2, 4) of 4)" "the sharded layout"
grep -qE "arrays \(model [0-9]+, optimizer [0-9]+" diff.txt ||
  fail "weights and optimizer state compared: $(cat diff.txt)"

# And it can fail: another version's arrays are named.
"$MOERL" checkpoint write-sample other 2 >/dev/null 2>&1
"$MOERL" checkpoint diff split other:2 >diff.txt 2>&1
expect_status 1 $? "diff against another version"
expect_contains diff.txt "only in split" "arrays only in the sharded version"

"$MOERL" checkpoint export split 1 split.h5 >out.txt 2>&1
expect_status 0 $? "export of the sharded version"
"$MOERL" checkpoint export whole 1 whole.h5 >out.txt 2>&1
expect_status 0 $? "export of the unsplit version"
if command -v h5dump >/dev/null; then
  h5dump -d /model/layers.1.mlp.experts.gate_proj split.h5 | sed 1,2d >a.txt 2>&1
  h5dump -d /model/layers.1.mlp.experts.gate_proj whole.h5 | sed 1,2d >b.txt 2>&1
  cmp -s a.txt b.txt || fail "export gathers the experts: the exports differ"
fi
finish
