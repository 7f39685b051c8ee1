# Hugging Face models end to end: `moerl eval` on an hf: source continues a
# prompt as the reference did (tests/parity/fixtures), import-hf then
# export-hf writes a directory that eval reads back to the same continuation,
# and a broken source is a configuration error naming the file.
source "$(dirname "$0")/lib.sh" "$@"
FIXTURE="$SOURCE_DIR/tests/parity/fixtures/qwen2_moe"
greedy=$(python3 -c "import json; print(' '.join(map(str, json.load(open('$FIXTURE/reference.json'))['greedy'][0])))")
prompt=$(python3 -c "import json; print(','.join(map(str, json.load(open('$FIXTURE/reference.json'))['prompts'][0])))")

printf '[model]\nsource = "hf:%s"\n' "$FIXTURE" > run.toml
"$MOERL" eval --config run.toml --tokens "$prompt" --max-new-tokens 8 --ignore-eos --threads 1 >out.txt 2>&1
expect_status 0 $? "eval on an hf: source"
expect_contains out.txt "Qwen2MoeForCausalLM" "eval names the architecture"
expect_contains out.txt "GB/s" "eval reports the load speed"
expect_contains out.txt "greedy, 8 tokens" "eval generates 8 tokens"
expect_contains out.txt "[$greedy]" "eval continues as the reference"

# Text through the model's tokenizer.json (byte-level BPE): the reference's ids and continuation.
text=$(python3 -c "import json; print(json.load(open('$FIXTURE/reference.json'))['text_prompt'])")
text_ids=$(python3 -c "import json; print(' '.join(map(str, json.load(open('$FIXTURE/reference.json'))['text_prompt_ids'])))")
text_greedy=$(python3 -c "import json; print(' '.join(map(str, json.load(open('$FIXTURE/reference.json'))['text_greedy'])))")
"$MOERL" eval --config run.toml --prompt "$text" --max-new-tokens 8 --ignore-eos --threads 1 >out.txt 2>&1
expect_status 0 $? "eval --prompt"
expect_contains out.txt "tokenizer: $FIXTURE/tokenizer.json" "eval uses the model's tokenizer.json"
expect_contains out.txt "tokens [$text_ids]" "the prompt's ids are the reference tokenizer's"
expect_contains out.txt "[$text_greedy]" "the text prompt continues as the reference"

"$MOERL" checkpoint import-hf store 3 --config run.toml >out.txt 2>&1
expect_status 0 $? "import-hf"
"$MOERL" checkpoint export-hf store 3 exported --shard-mb 0.05 >out.txt 2>&1
expect_status 0 $? "export-hf"
expect_contains out.txt "as Qwen2MoeForCausalLM" "export-hf names the architecture"
expect_contains out.txt "copied tokenizer.json generation_config.json" "export-hf copies the source's files"
[ -f exported/model.safetensors.index.json ] || fail "export-hf writes the index"
[ "$(ls exported/model-000*-of-*.safetensors | wc -l)" -ge 2 ] || fail "export-hf writes several shards"

printf '[model]\nsource = "hf:%s/exported"\n' "$WORK" > exported.toml
"$MOERL" eval --config exported.toml --tokens "$prompt" --max-new-tokens 8 --ignore-eos --threads 1 >out.txt 2>&1
expect_status 0 $? "eval on the export"
expect_contains out.txt "[$greedy]" "the export continues as the reference"

mkdir broken && cp "$FIXTURE"/* broken/ && sed -i 's/"qwen2_moe"/"qwen9_moe"/' broken/config.json
printf '[model]\nsource = "hf:%s/broken"\n' "$WORK" > broken.toml
"$MOERL" eval --config broken.toml --tokens 1,2 >out.txt 2>&1
expect_status 2 $? "an unknown architecture is a configuration error"
expect_contains out.txt "broken/config.json" "the error names the file"
expect_contains out.txt "qwen9_moe" "the error names the architecture"
finish
