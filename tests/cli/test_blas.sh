# The BLAS kernels moerl runs on (include/moerl/core/blas_kernels.h,
# docs/performance.md):
#   - --version names the BLAS, its core, its threads and how the core was chosen;
#   - a core set with OPENBLAS_CORETYPE is respected, and one the library
#     cannot load is named in a warning;
#   - when OpenBLAS falls back to its SSE3 kernels ("Prescott", as Debian's
#     0.3.21 does on Intel Sapphire Rapids; simulated here with
#     MOERL_BLAS_TEST_PRETEND_CHOSEN) on a CPU with AVX or better, moerl
#     starts itself afresh with the CPU's core, in every rank of a job;
#   - when that core fails the GEMM check, moerl goes back to OpenBLAS's
#     choice and every rank warns;
#   - a benchmark's host block names the core.
# Not OpenBLAS (a build against PyPI torch's MKL): skipped (exit 77), saying so.
source "$(dirname "$0")/lib.sh" "$@"

"$MOERL" --version >version.txt 2>&1
expect_status 0 $? "--version"
if ! grep -q "^BLAS: OpenBLAS" version.txt; then
  echo "skipped: this build's BLAS is not OpenBLAS ($(grep '^BLAS' version.txt)); nothing to choose"
  exit 77
fi
core=$(sed -n 's/^BLAS: OpenBLAS [^ ]* (core \([A-Za-z0-9_]*\), .*/\1/p' version.txt)
[ -n "$core" ] || fail "--version: no core named: $(cat version.txt)"
grep -q "^BLAS: .* threads\?; " version.txt || fail "--version: no thread count or choice: $(cat version.txt)"

# The user's choice is respected, even a slow one.
OPENBLAS_CORETYPE=Prescott "$MOERL" --version >user.txt 2>&1
expect_contains user.txt "(core Prescott, " "OPENBLAS_CORETYPE=Prescott: loaded"
expect_contains user.txt "set by OPENBLAS_CORETYPE" "OPENBLAS_CORETYPE=Prescott: said"
OPENBLAS_CORETYPE=NoSuchCore "$MOERL" --version >bogus.txt 2>&1
expect_contains bogus.txt "BLAS warning: OPENBLAS_CORETYPE=NoSuchCore is not a core this OpenBLAS can load" \
  "OPENBLAS_CORETYPE=NoSuchCore: named"

# The core this CPU should get, by its /proc/cpuinfo flags (an oracle apart
# from the code's __builtin_cpu_supports).
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { case "$flags" in *" $1 "*) return 0 ;; esac; return 1; }
want=""
if has avx512f && has avx512bw && has avx512vl && has avx512dq && has avx512cd; then want=SkylakeX
elif has avx2 && has fma; then want=Haswell
elif has avx; then want=Sandybridge
fi
if [ -z "$want" ]; then
  echo "note: this CPU has no AVX: OpenBLAS's SSE kernels are the best it has; the selection is not exercised"
else
  MOERL_BLAS_TEST_PRETEND_CHOSEN=Prescott "$MOERL" --version >selected.txt 2>&1
  expect_contains selected.txt "(core $want, " "a Prescott fallback: $want loaded"
  expect_contains selected.txt "selected by moerl for" "a Prescott fallback: said"
  expect_contains selected.txt "OpenBLAS chose Prescott" "a Prescott fallback: OpenBLAS's choice named"
  grep -q "BLAS warning" selected.txt && fail "a Prescott fallback: a warning: $(cat selected.txt)"
  # A failed check goes back to OpenBLAS's choice (Prescott here), with a warning.
  MOERL_BLAS_TEST_PRETEND_CHOSEN=Prescott MOERL_BLAS_TEST_FAIL_CHECK=1 "$MOERL" --version >undone.txt 2>&1
  expect_status 0 $? "a failed check: --version"
  expect_contains undone.txt "(core Prescott, " "a failed check: back to Prescott"
  expect_contains undone.txt "BLAS warning: moerl's choice $want was undone: the GEMM check failed" "a failed check: warned"

  # Every rank of a job makes the same choice before MPI starts.
  "${LAUNCH[@]}" -n 4 train --config "$SOURCE_DIR/configs/quickstart.toml" --set run.output_dir="$WORK/runs" \
    --dry-run >job.txt 2>&1 </dev/null
  expect_status 0 $? "a dry run"
  env MOERL_BLAS_TEST_PRETEND_CHOSEN=Prescott "${LAUNCH[@]}" -n 4 train --config "$SOURCE_DIR/configs/quickstart.toml" \
    --set run.output_dir="$WORK/runs" --dry-run >job_selected.txt 2>&1 </dev/null
  expect_status 0 $? "a dry run, Prescott fallback"
  expect_contains job_selected.txt "BLAS: OpenBLAS 0" "a dry run: the BLAS in the first lines"
  expect_contains job_selected.txt "(core $want, 1 thread; selected by moerl" "a dry run: $want on rank 0"
  expect_contains job_selected.txt "messages: 30 exchanged" "a dry run: every rank took part"
  env MOERL_BLAS_TEST_PRETEND_CHOSEN=Prescott MOERL_BLAS_TEST_FAIL_CHECK=1 "${LAUNCH[@]}" -n 4 train \
    --config "$SOURCE_DIR/configs/quickstart.toml" --set run.output_dir="$WORK/runs" --dry-run >job_undone.txt 2>&1 </dev/null
  expect_status 0 $? "a dry run, failed check"
  expect_count job_undone.txt "BLAS: moerl's choice $want was undone" 4 "a dry run, failed check: every rank warns"
fi

# A benchmark result names the kernels it ran on.
"$MOERL" bench messages --quick --out result.json >bench.txt 2>&1
expect_status 0 $? "bench messages"
python3 - result.json "$core" <<'PY' || fail "bench host block: the BLAS"
import json, sys
host = json.load(open(sys.argv[1]))["host"]
assert host["blas"].startswith("OpenBLAS "), host
assert host["blas_core"] == sys.argv[2], (host["blas_core"], sys.argv[2])
assert host["blas_threads"] >= 1, host
assert host["blas_choice"], host
PY
# bench blas measures every core this CPU runs against Prescott, each in its own process.
"$MOERL" bench blas --quick --threads 1 --out blas.json >blas.txt 2>&1
expect_status 0 $? "bench blas"
python3 - blas.json "$want" "$core" <<'PY' || { fail "bench blas: cores measured"; sed 's/^/    | /' blas.txt; }
import json, sys
want, core = sys.argv[2], sys.argv[3]
cases = json.load(open(sys.argv[1]))["cases"]
assert cases, "no cases"
for c in cases:
    m = c["metrics"]
    assert m["GFLOP_per_s"] > 0 and m["GFLOP_per_s_Prescott"] > 0, m
    assert c["params"]["core"] == core, c["params"]
    if want:
        assert "GFLOP_per_s_" + want in m, (want, sorted(m))
PY
finish
