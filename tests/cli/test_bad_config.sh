# A bad configuration stops every rank with status 2 and one clear message
# naming the file, line and key, before any work starts.
source "$(dirname "$0")/lib.sh" "$@"
CONFIG="$SOURCE_DIR/configs/quickstart.toml"

sed 's/^actors = 2/actros = 2/' "$CONFIG" > misspelt.toml
line=$(grep -n '^actros' misspelt.toml | cut -d: -f1)
"${LAUNCH[@]}" -n 4 train --config misspelt.toml --dry-run >out.txt 2>&1
expect_status 2 $? "misspelt key under mpirun"
expect_contains out.txt "misspelt.toml:$line: [cluster] actros: unknown key; did you mean 'actors'?" "misspelt key message"
expect_count out.txt "unknown key" 1 "message printed once"
expect_count out.txt "moerl dry run" 0 "no work started"

"${LAUNCH[@]}" -n 3 train --config "$CONFIG" --dry-run >out.txt 2>&1
expect_status 2 $? "wrong rank count"
expect_contains out.txt "= 4 ranks, but the job has 3" "rank count message"
expect_count out.txt "but the job has" 1 "rank count message printed once"

"${LAUNCH[@]}" -n 4 train --config "$CONFIG" --dry-run --set moe.top_k=12 >out.txt 2>&1
expect_status 2 $? "--set out of range"
expect_contains out.txt "--set moe.top_k=12: [moe] top_k: must be <= num_experts (8), got 12" "--set message"

# [run] device = "cuda" on a host without a usable CUDA device (LibTorch
# without CUDA, or no GPU visible): status 2 on every rank before any work,
# one message naming run.device, the rank and the host. (Skipped where a GPU
# is visible: there the job would start.)
if ! nvidia-smi -L >/dev/null 2>&1; then
  run_job no_gpu 120 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" --set run.device=cuda --set run.output_dir=runs
  expect_status 2 $? "run.device=cuda without a CUDA device"
  expect_contains no_gpu.txt "--set run.device=cuda: [run] device: rank 0 (learner 0) on host $(hostname)" \
    "device message names the key, rank and host"
  expect_contains no_gpu.txt "has no usable CUDA device" "device message says why"
  expect_contains no_gpu.txt "set run.device = \"cpu\"" "device message says what to do"
  expect_count no_gpu.txt "has no usable CUDA device" 1 "device message printed once"
  expect_count no_gpu.txt "evaluating the base policy" 0 "no work started"
  [ ! -e runs/quickstart/checkpoints ] || fail "run.device=cuda without a device: a checkpoint store was made"
fi

"$MOERL" config check "$CONFIG" --set model.d_model=wide >out.txt 2>&1
expect_status 2 $? "config check wrong type"
expect_contains out.txt "[model] d_model: expected an integer, got a string" "type message"

"$MOERL" config check "$CONFIG" >out.txt 2>&1
expect_status 0 $? "config check valid"
"$MOERL" config check "$CONFIG" --ranks 5 >out.txt 2>&1
expect_status 2 $? "config check --ranks mismatch"

# show prints every key; what it prints checks clean and resolves identically.
"$MOERL" config show "$CONFIG" --set moe.top_k=3 >shown.toml 2>&1
expect_status 0 $? "config show"
expect_contains shown.toml "top_k = 3" "override shown"
expect_contains shown.toml "capacity_factor = 0.0" "defaults shown"
"$MOERL" config show shown.toml >shown_again.toml 2>&1
expect_status 0 $? "config show of shown output"
diff <(grep -v '^#' shown.toml | sed 's/ *# default$//') <(grep -v '^#' shown_again.toml | sed 's/ *# default$//') \
  || fail "config show is not a fixed point"
finish
