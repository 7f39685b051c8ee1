# The float GEMM library of moerl's own kernels (moerl_kernels/cpu_gemm.h,
# docs/performance.md):
#   - --version names it, and how it was chosen;
#   - MOERL_CPU_GEMM=blas picks BLAS; a value moerl does not know, or one
#     this build lacks, stops with exit 2 naming the variable;
#   - when oneDNN fails the GEMM check (simulated with
#     MOERL_CPU_GEMM_TEST_FAIL_CHECK), moerl goes back to BLAS and every rank
#     of a job warns;
#   - a benchmark's host block names it.
source "$(dirname "$0")/lib.sh" "$@"

"$MOERL" --version >version.txt 2>&1
expect_status 0 $? "--version"
expect_contains version.txt "GEMM (moerl's kernels): " "--version names the GEMM library"

MOERL_CPU_GEMM=blas "$MOERL" --version >blas.txt 2>&1
expect_status 0 $? "MOERL_CPU_GEMM=blas: --version"
expect_contains blas.txt "GEMM (moerl's kernels): BLAS sgemm (MOERL_CPU_GEMM)" "MOERL_CPU_GEMM=blas"

MOERL_CPU_GEMM=mkl "$MOERL" --version >bogus.txt 2>&1
expect_status 2 $? "MOERL_CPU_GEMM=mkl"
expect_contains bogus.txt "MOERL_CPU_GEMM='mkl': expected 'onednn' or 'blas'" "MOERL_CPU_GEMM=mkl: the error"

if grep -q "^GEMM (moerl's kernels): oneDNN" version.txt; then
  expect_contains version.txt "sgemm (the default; checked)" "oneDNN by default, checked"
  MOERL_CPU_GEMM_TEST_FAIL_CHECK=1 "$MOERL" --version >undone.txt 2>&1
  expect_status 0 $? "a failed check: --version"
  expect_contains undone.txt "GEMM (moerl's kernels): BLAS sgemm (oneDNN failed its check)" "a failed check: BLAS"
  expect_contains undone.txt "GEMM warning: oneDNN's sgemm failed the GEMM check" "a failed check: the warning"
  env MOERL_CPU_GEMM_TEST_FAIL_CHECK=1 "${LAUNCH[@]}" -n 4 train --config "$SOURCE_DIR/configs/quickstart.toml" \
    --set run.output_dir="$WORK/runs" --dry-run >job_undone.txt 2>&1 </dev/null
  expect_status 0 $? "a dry run, failed check"
  expect_count job_undone.txt "GEMM: oneDNN's sgemm failed the GEMM check" 4 "a dry run, failed check: every rank warns"
else
  echo "this build has no oneDNN: $(grep '^GEMM' version.txt)"
  MOERL_CPU_GEMM=onednn "$MOERL" --version >missing.txt 2>&1
  expect_status 2 $? "MOERL_CPU_GEMM=onednn without oneDNN"
  expect_contains missing.txt "this build has no onednn" "MOERL_CPU_GEMM=onednn without oneDNN: the error"
fi

# A benchmark result names the GEMM library it ran on.
MOERL_CPU_GEMM=blas "$MOERL" bench messages --quick --out result.json >bench.txt 2>&1
expect_status 0 $? "bench messages"
python3 - result.json <<'PY' || fail "bench host block: the GEMM library"
import json, sys
host = json.load(open(sys.argv[1]))["host"]
assert host["cpu_gemm"] == "BLAS sgemm (MOERL_CPU_GEMM)", host
PY
finish
