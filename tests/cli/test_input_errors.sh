# Input errors name the thing at fault: a config path that is a directory or
# missing (status 2 under every subcommand that takes a config, printed once
# under mpirun), --init weights of another model shape (refused at load,
# naming the tensor and both shapes), an hf: config.json with absurd sizes
# (a configuration error naming the file and key), and a corrupt `latest`
# pointer (checkpoint list still lists every version and marks it).
source "$(dirname "$0")/lib.sh" "$@"
CONFIG="$SOURCE_DIR/configs/quickstart.toml"
mkdir confdir

# --- Config paths ------------------------------------------------------------
"$MOERL" config check confdir >out.txt 2>&1
expect_status 2 $? "config check DIR"
expect_contains out.txt "confdir: is a directory, not a TOML configuration file" "config check DIR message"
expect_count out.txt ": valid" 0 "a directory is not called valid"
"$MOERL" config check missing.toml >out.txt 2>&1
expect_status 2 $? "config check missing"
expect_contains out.txt "missing.toml: no such configuration file" "config check missing message"
"$MOERL" config show confdir >out.txt 2>&1
expect_status 2 $? "config show DIR"
"$MOERL" config get confdir run.name >out.txt 2>&1
expect_status 2 $? "config get DIR"
expect_contains out.txt "confdir: is a directory" "config get DIR message"

# The same status and message from every subcommand that takes a config
# (before: 105, CLI11's code for a failed ExistingFile check).
check_missing() {  # check_missing WHAT COMMAND...
  local what="$1"
  shift
  "$@" >out.txt 2>&1
  expect_status 2 $? "$what"
  expect_contains out.txt "missing.toml: no such configuration file" "$what message"
}
check_missing "train --config missing" "$MOERL" train --config missing.toml
check_missing "eval --config missing" "$MOERL" eval --config missing.toml --prompt hi
check_missing "pretrain --config missing" "$MOERL" pretrain --config missing.toml
check_missing "env play --config missing" "$MOERL" env play --family guess --config missing.toml
check_missing "import-hf --config missing" "$MOERL" checkpoint import-hf store 1 --config missing.toml
check_missing "bench e2e --config missing" "$MOERL" bench e2e --config missing.toml
"$MOERL" train --config confdir >out.txt 2>&1
expect_status 2 $? "train --config DIR"
expect_contains out.txt "confdir: is a directory, not a TOML configuration file" "train --config DIR message"

# Under mpirun every rank stops with status 2 and one rank says why.
for target in missing.toml confdir; do
  timeout 60 "${LAUNCH[@]}" -n 4 train --config "$target" >out.txt 2>&1
  expect_status 2 $? "mpirun train --config $target"
  expect_count out.txt "$target: " 1 "mpirun train --config $target: message printed once"
  expect_contains out.txt "every rank stops with status 2" "mpirun train --config $target: every rank stops"
done

# --- --init weights of another shape -----------------------------------------
RUNS="$WORK/runs"
BASE="$RUNS/quickstart/base.pt"
"$MOERL" pretrain --config "$CONFIG" --set run.output_dir="$RUNS" --set pretrain.episodes=16 \
  --set pretrain.steps=1 --threads 1 >out.txt 2>&1
expect_status 0 $? "pretrain a tiny base"
[ -f "$BASE" ] || fail "pretrain wrote no $BASE"
"$MOERL" eval --config "$CONFIG" --init "$BASE" --prompt hi --max-new-tokens 1 --threads 1 >out.txt 2>&1
expect_status 0 $? "eval --init with the pretrained shape"

"$MOERL" eval --config "$CONFIG" --set model.d_model=64 --init "$BASE" --prompt hi --max-new-tokens 1 \
  --threads 1 >out.txt 2>&1
expect_status 1 $? "eval --init of another d_model"
expect_contains out.txt "cannot load policy weights from '$BASE'" "eval --init names the file"
expect_contains out.txt "tensor 'embed_tokens.weight' is [264, 128] in the file but [264, 64] in the configured model" \
  "eval --init names the first mismatched tensor and both shapes"
expect_count out.txt "is invalid for input of size" 0 "eval --init fails at load, not in the forward pass"
"$MOERL" eval --config "$CONFIG" --set model.num_layers=3 --init "$BASE" --prompt hi --max-new-tokens 1 \
  --threads 1 >out.txt 2>&1
expect_status 1 $? "eval --init with fewer layers than the model"
expect_contains out.txt "missing from the file: layers.2.input_layernorm.weight" "missing tensors named"

# Under train: a fatal error on the ranks that build a policy; the job ends
# promptly and the message names the tensor.
start=$(date +%s)
timeout 120 "${LAUNCH[@]}" -n 4 train --config "$CONFIG" --set run.output_dir="$RUNS" \
  --set model.d_model=64 --init "$BASE" >out.txt 2>&1
status=$?
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || fail "train --init of another shape: exit status $status"
expect_contains out.txt "moerl: fatal error on rank" "train --init: a fatal error"
expect_contains out.txt "tensor 'embed_tokens.weight' is [264, 128] in the file but [264, 64]" "train --init names the tensor"
expect_count out.txt "is invalid for input of size" 0 "train --init fails at load"
[ $(( $(date +%s) - start )) -lt 60 ] || fail "train --init of another shape took more than 60 s to end"

# --- hf: config.json with absurd sizes ---------------------------------------
mkdir hf
cp "$SOURCE_DIR/tests/parity/fixtures/mixtral/config.json" hf/
printf '[model]\nsource = "hf:%s/hf"\n' "$WORK" > hf.toml
"$MOERL" config check hf.toml >out.txt 2>&1
expect_status 0 $? "config check of the unedited hf: source"
set_field() {  # set_field KEY VALUE: edits hf/config.json from the fixture
  python3 - "$SOURCE_DIR/tests/parity/fixtures/mixtral/config.json" "$1" "$2" <<'EOF'
import json, sys
config = json.load(open(sys.argv[1]))
config[sys.argv[2]] = json.loads(sys.argv[3])
json.dump(config, open("hf/config.json", "w"), indent=2)
EOF
}
check_hf() {  # check_hf WHAT TEXT: config check and eval both refuse with TEXT
  local what="$1" text="$2"
  "$MOERL" config check hf.toml >out.txt 2>&1
  expect_status 2 $? "config check: $what"
  expect_contains out.txt "hf.toml:2: [model] source: $WORK/hf/config.json: $text" "config check: $what message"
  "$MOERL" eval --config hf.toml --prompt hi --max-new-tokens 1 --threads 1 >out.txt 2>&1
  expect_status 2 $? "eval: $what"
  expect_contains out.txt "$WORK/hf/config.json: $text" "eval: $what message"
  expect_count out.txt "Exception raised from" 0 "eval: $what: no LibTorch stack trace"
}
set_field hidden_size 1e12
check_hf "hidden_size 1e12" "the sizes (vocab_size 128, hidden_size 1000000000000, "
expect_contains out.txt "give more parameters than a 64-bit count holds" "hidden_size 1e12: overflow said"
set_field num_hidden_layers 1e9
check_hf "num_hidden_layers 1e9" "the sizes ("
expect_contains out.txt "num_hidden_layers 1000000000" "num_hidden_layers 1e9: the key named"
expect_contains out.txt "TiB as float32, more than this machine's" "num_hidden_layers 1e9: the estimate against memory"
set_field intermediate_size 1e15
check_hf "intermediate_size 1e15" "the sizes ("
expect_contains out.txt "intermediate_size 1000000000000000" "intermediate_size 1e15: the key named"
set_field vocab_size -128
check_hf "vocab_size negative" "field 'vocab_size': must be >= 2, got -128"
set_field vocab_size 1e300
check_hf "vocab_size 1e300" "field 'vocab_size': expected an integer of at most 2^53, got 1e+300"

# --- checkpoint list with a corrupt `latest` ---------------------------------
CKPT="$WORK/ckpt"
for v in 1 2; do
  "$MOERL" checkpoint write-sample "$CKPT" "$v" >out.txt 2>&1
  expect_status 0 $? "write-sample $v"
done
echo garbage > "$CKPT/latest"
"$MOERL" checkpoint list "$CKPT" >out.txt 2>&1
expect_status 0 $? "list with a corrupt latest"
expect_count out.txt "  valid " 2 "both versions listed"
expect_contains out.txt "v000001   10 " "v1 listed"
expect_contains out.txt "v000002   20 " "v2 listed"
expect_contains out.txt "latest: CORRUPT (latest pointer '$CKPT/latest' is corrupt: 'garbage')" "latest marked corrupt"
expect_contains out.txt "--resume auto takes the newest valid version, v000002" "list says what resume takes"
"$MOERL" checkpoint verify "$CKPT" >out.txt 2>&1
expect_status 0 $? "verify with a corrupt latest"
"$MOERL" checkpoint rollback "$CKPT" --to 1 >out.txt 2>&1
expect_status 0 $? "rollback --to repairs a corrupt latest"
expect_contains "$CKPT/latest" "v000001" "latest rewritten"
"$MOERL" checkpoint list "$CKPT" >out.txt 2>&1
expect_contains out.txt "latest: v000001" "latest listed after the repair"
echo v000009 > "$CKPT/latest"
"$MOERL" checkpoint list "$CKPT" >out.txt 2>&1
expect_status 0 $? "list with latest naming no version"
expect_contains out.txt "latest: v000009 (no such version on disk)" "a dangling latest is said"
finish
