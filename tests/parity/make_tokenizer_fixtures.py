#!/usr/bin/env python3
"""Regenerates the byte-level BPE tokenizer fixtures under
tests/parity/fixtures/tokenizer/ with the reference implementation (the
Hugging Face `tokenizers` package), which tests/unit/test_bpe_tokenizer.cpp
then compares moerl::text::BpeTokenizer against.

    python3 tests/parity/make_tokenizer_fixtures.py [VENV_DIR]

Creates VENV_DIR (default /tmp/parity-venv) when it does not exist, installs
`tokenizers` there from PyPI and re-runs itself inside it. For each layout
(Qwen2: NFC + Split regex + ByteLevel; GPT-2: ByteLevel with its own regex and
merges in the old "a b" string form; Llama-3: its regex with ignore_merges)
it trains a small tokenizer on TRAIN_TEXT, writes <name>/tokenizer.json, and
records in <name>/expected.json the reference encodings and decodings of
texts the tokenizer was not trained on.
"""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "fixtures", "tokenizer")
TOKENIZERS_VERSION = "0.23.3"  # pinned so that regenerating is reproducible


def ensure_venv() -> None:
    """Re-executes this script inside a virtual environment that has `tokenizers`."""
    try:
        import tokenizers  # noqa: F401

        return
    except ImportError:
        pass
    if os.environ.get("MOERL_PARITY_VENV_ACTIVE"):
        sys.exit("make_tokenizer_fixtures: `tokenizers` is still missing inside the venv")
    venv = sys.argv[1] if len(sys.argv) > 1 else "/tmp/parity-venv"
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    subprocess.check_call([python, "-m", "pip", "install", "-q", f"tokenizers=={TOKENIZERS_VERSION}"])
    env = dict(os.environ, MOERL_PARITY_VENV_ACTIVE="1")
    os.execve(python, [python, os.path.abspath(__file__)] + sys.argv[1:], env)


# Training text: a little of everything a policy sees (prose in several
# scripts, code, numbers, whitespace runs, emoji). Written for this fixture.
TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. It's what they'd said, and we'll see what you've done.
I'm sure the model doesn't know: THE ANSWER IS 42, isn't it? Don't panic.
Reinforcement learning from verifiable rewards trains the policy on its own rollouts.
Each episode has a system prompt, user turns and assistant turns; the reward arrives at the end.
Die Straße ist nass, weil es geregnet hat. Über den Bergen schläft der Bär; Grüße aus Köln!
Ärger, Öl und Übung machen den Meister. Das Mädchen hörte die Vögel früh am Morgen.
我们在周末训练一个小模型。强化学习需要奖励信号和大量的采样。这个句子是中文的例子。
今天的天气很好，我们去公园散步吧。模型的输出需要验证。
Привет, мир! Мы обучаем модель с подкреплением. Это пример русского текста для обучения.
Москва — столица России. Ответ: сорок два.
Emoji: 😀 🚀 👍🏽 🇩🇪 ❤️ 👩‍💻 and some ✓ ✗ marks → arrows ← and math ∑ ∫ √ π ≈ 3.14159.
def reward(answer: str, target: int) -> float:
    if answer.strip() == str(target):
        return 1.0
    return 0.0

for (int i = 0; i < n; ++i) { sum += x[i] * w[i]; }  // dot product
x = [1, 2, 3, 4, 5]; y = {"key": "value", "n": 12345};
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2026 3.5 -7 1e-4 65536 0xFF 255.
Whitespace:    four spaces,\ttab,\t\ttwo tabs, trailing   
  indented line
\r\nwindows line end\r\n

blank lines above and   runs   of   spaces.
"""

# Held out: the fixture's encodings are of texts the merges were not learned on.
HELD_OUT_TEXT = """\
Hello, World! We're testing THE tokenizer's behaviour — it'll split "quoted" words & symbols.
Rückmeldung: Die Prüfung läuft schnell; Fußgänger überqueren die Straße.
强化学习的奖励来自环境。模型生成答案，环境给出分数。
Обучение с подкреплением: политика получает награду 1.0 за верный ответ.
😀🚀 x² + y² = z²; naïve café résumé; 👨‍👩‍👧 family; 🇯🇵 flag.
    return sorted(items, key=lambda kv: (-kv[1], kv[0]))[:10]
Numbers 31415926535 and 2.71828, phone +49-30-1234567, year 1999.
Tabs\tand\t\tspaces   mixed \n\n  \r\n end.   """

# Short texts for particular rules; each is encoded and decoded on its own.
EDGE_TEXTS = [
    "",
    " ",
    "   ",
    "\n",
    "a",
    "ab ab ab",
    "DON'T YOU'LL I'M He'S",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|endoftext|><|endoftext|>",
    "<|im_start|<|im_end|>>",  # a partial special token before a full one
    "<think>step by step</think> answer",
    "u\u0308ber Cafe\u0301",  # decomposed umlaut and accent: NFC composes them
    "\u00c5ngstr\u00f6m \u212b",  # U+212B ANGSTROM SIGN: NFC maps it to U+00C5
    "1234567890 12 123 1234",
    "trailing spaces   ",
    "  leading spaces",
    "tab\t\t\tafter",
    "\u00a0non-breaking\u2003em space\u3000ideographic",
    "a\u0085b \u0085 x\u0085\u0085 \u0085",  # NEL: White_Space, so \s for the reference
    "a\u180eb \u180e x\u180e\u180e \u180e",  # U+180E: not White_Space since Unicode 6.3
    "a \u180eb x!\u180e!y",
    "\ufeffbom\u200bzero-width",
    "x" * 300,
    "\U0001F600" * 5,
]

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build(name: str):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if name == "llama3":
        tok = Tokenizer(models.BPE(ignore_merges=True))
    else:
        tok = Tokenizer(models.BPE())
    if name == "qwen2":
        tok.normalizer = normalizers.NFC()
    if name == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pattern = QWEN2_PATTERN if name == "qwen2" else LLAMA3_PATTERN
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN_TEXT.splitlines(keepends=True), trainer)
    # A non-special added token, as Qwen3 has for <think>: matched before the
    # pre-tokenizer, but still matched when special tokens are not allowed.
    tok.add_tokens([AddedToken("<think>", normalized=False, special=False),
                    AddedToken("</think>", normalized=False, special=False)])
    return tok


def rewrite_merges_as_strings(path: str) -> None:
    """The GPT-2 fixture keeps the older "a b" merge form (tokenizers < 0.20)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")


BYTE_OF_CHAR = None


def pre_tokens(tok, text: str) -> list:
    """The reference's pre-tokens of `text` (normalized, split), as text."""
    global BYTE_OF_CHAR
    from tokenizers import pre_tokenizers

    if BYTE_OF_CHAR is None:
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        # The alphabet lists the 256 characters; recover each one's byte.
        printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or b >= 0xAE]
        BYTE_OF_CHAR = {chr(b): b for b in printable}
        shifted = 256
        for b in range(256):
            if b not in BYTE_OF_CHAR.values():
                BYTE_OF_CHAR[chr(shifted)] = b
                shifted += 1
        assert set(BYTE_OF_CHAR) == set(alphabet)
    normalized = tok.normalizer.normalize_str(text) if tok.normalizer else text
    pieces = tok.pre_tokenizer.pre_tokenize_str(normalized)
    return [bytes(BYTE_OF_CHAR[c] for c in piece).decode("utf-8") for piece, _ in pieces]


def add_random_merges(path: str, count: int = 1500, seed: int = 8) -> None:
    """Stresses the merge order: merges of random adjacent parts of the
    held-out text's pre-tokens, interleaved at random ranks among the trained
    ones, so that overlapping candidate pairs compete everywhere."""
    import random

    from tokenizers import Tokenizer

    rng = random.Random(seed)
    tok = Tokenizer.from_file(path)
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    vocab, merges = data["model"]["vocab"], data["model"]["merges"]
    pieces = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(HELD_OUT_TEXT))]
    pieces = [p for p in pieces if len(p) >= 2]
    next_id = max(vocab.values()) + 1
    new = []
    while len(new) < count:
        word = rng.choice(pieces)
        i = rng.randrange(0, len(word) - 1)
        j = rng.randrange(i + 1, min(len(word), i + 4))
        k = rng.randrange(j + 1, min(len(word), j + 4) + 1)
        left, right = word[i:j], word[j:k]
        if left in vocab and right in vocab and left + right not in vocab:
            vocab[left + right] = next_id
            next_id += 1
            new.append([left, right])
    for pair in new:
        merges.insert(rng.randrange(0, len(merges) + 1), pair)
    for token in data["added_tokens"]:  # added tokens after the vocabulary, as trained
        if token["content"] not in vocab:
            token["id"] = next_id
            next_id += 1
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)


def compact(path: str) -> None:
    """Rewrites a JSON file without indentation (the fixtures stay < 300 KB)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))


def record(tok, text: str) -> dict:
    tok.encode_special_tokens = False
    ids = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = True
    ids_plain = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return {
        "text": text,
        "ids": ids,
        "ids_no_special": ids_plain,
        "decoded": tok.decode(ids, skip_special_tokens=False),
        "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        # Without cutting out added tokens, like the C++ pre_tokenize().
        "pre_tokens": pre_tokens(tok, text),
    }


def make(name: str) -> None:
    from tokenizers import Tokenizer

    out = os.path.join(OUT_DIR, name)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "tokenizer.json")
    build("qwen2" if name == "random_merges" else name).save(path, pretty=True)
    if name == "gpt2":
        rewrite_merges_as_strings(path)
    if name == "random_merges":
        add_random_merges(path)
    if name in ("llama3", "random_merges"):
        compact(path)  # only qwen2 and gpt2 stay indented: the C++ tests edit their text
    tok = Tokenizer.from_file(path)  # what is recorded is what the saved file does
    held_out = record(tok, HELD_OUT_TEXT)
    # Each id of the held-out text alone: partial UTF-8 sequences come back
    # from the reference as U+FFFD (Rust's String::from_utf8_lossy).
    single = {str(i): tok.decode([i], skip_special_tokens=False) for i in sorted(set(held_out["ids"]))}
    expected = {
        "reference": f"tokenizers {sys.modules['tokenizers'].__version__}",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "held_out": held_out,
        "edge_cases": [record(tok, t) for t in EDGE_TEXTS],
        "single_id_decodes": single,
    }
    if name == "random_merges":
        # The same file with ignore_merges = true (Llama-3's setting): words
        # in the vocabulary whose random merges would split them differently.
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        data["model"]["ignore_merges"] = True
        whole = Tokenizer.from_str(json.dumps(data))
        expected["with_ignore_merges"] = [
            {"text": t, "ids": whole.encode(t, add_special_tokens=False).ids} for t in [HELD_OUT_TEXT] + EDGE_TEXTS
        ]
    if name == "gpt2":
        # The same file with the pre-tokenizer's add_prefix_space = true (the
        # C++ test makes that one edit): ids only, to keep the fixture small.
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        data["pre_tokenizer"]["add_prefix_space"] = True
        prefixed = Tokenizer.from_str(json.dumps(data))
        expected["with_prefix_space"] = [
            {"text": t, "ids": prefixed.encode(t, add_special_tokens=False).ids,
             "pre_tokens": pre_tokens(prefixed, t)}
            for t in [HELD_OUT_TEXT] + EDGE_TEXTS
        ]
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{name}: vocab {expected['vocab_size']}, held-out text {len(HELD_OUT_TEXT)} chars "
          f"-> {len(held_out['ids'])} tokens")


def main() -> None:
    ensure_venv()
    for name in ["qwen2", "gpt2", "llama3", "random_merges"]:
        make(name)


if __name__ == "__main__":
    main()
