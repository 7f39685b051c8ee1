#!/usr/bin/env python3
"""Regenerates the Hugging Face model parity fixtures under
tests/parity/fixtures/<arch>/ with the reference implementation
(transformers), which tests/torch/test_hf_parity.cpp compares moerl against.

    python3 tests/parity/make_fixtures.py [--venv DIR] [--moerl PATH/TO/moerl]

Creates the virtual environment (default tests/parity/.venv) when it lacks
the reference stack, installs it there from PyPI and re-runs itself inside
it. For each architecture (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) it builds a
tiny random model that exercises that architecture's features, saves it with
save_pretrained (one of them sharded), and records in the model directory:

  reference.safetensors  logits.<i>: float32 [len(prompt i), vocab] for each prompt
  reference.json         prompts (token ids) and greedy continuations; for the
                         model with a tokenizer.json (qwen2_moe, the BPE
                         fixture's Qwen2 tokenizer), also a text prompt, its
                         reference ids and greedy continuation

With --moerl, it also checks the way back: `moerl checkpoint import-hf`
stores each model in a checkpoint store, `moerl checkpoint export-hf` writes
it out again, and the reference library must load the export and reproduce
the recorded logits and continuations.

The byte-level BPE tokenizer fixtures are made by make_tokenizer_fixtures.py.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "fixtures")
# Pinned so that regenerating is reproducible.
PACKAGES = ["torch==2.15.0", "transformers==5.24.0", "safetensors==0.8.0", "tokenizers==0.23.3"]

PROMPTS = [[5, 17, 99, 3, 42, 8, 77, 61, 23, 11, 90, 4], [7, 120, 33, 2, 64]]
NEW_TOKENS = 8
VOCAB = 128
# One model carries a real tokenizer.json (the BPE fixture's Qwen2 layout), so
# that `moerl eval --prompt TEXT` is checked end to end against the reference.
TOKENIZER = os.path.join(OUT_DIR, "tokenizer", "qwen2", "tokenizer.json")
TEXT_PROMPT = "The policy answers: 42, and we'll see!"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", default=os.path.join(HERE, ".venv"))
    parser.add_argument("--moerl", default="", help="the built moerl binary: also check export-hf")
    return parser.parse_args()


def ensure_venv(args) -> None:
    """Re-executes this script inside a virtual environment with the reference stack."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import safetensors  # noqa: F401

        return
    except ImportError:
        pass
    if os.environ.get("MOERL_PARITY_VENV_ACTIVE"):
        sys.exit("make_fixtures: the reference stack is still missing inside the venv")
    python = os.path.join(args.venv, "bin", "python")
    if not os.path.exists(python):
        subprocess.check_call([sys.executable, "-m", "venv", args.venv])
    subprocess.check_call([python, "-m", "pip", "install", "-q"] + PACKAGES)
    env = dict(os.environ, MOERL_PARITY_VENV_ACTIVE="1")
    os.execve(python, [python, os.path.abspath(__file__)] + sys.argv[1:], env)


def common(**extra):
    """Sizes every tiny model shares; extra overrides per architecture."""
    base = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                num_experts_per_tok=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    base.update(extra)
    return base


def tokenizer_vocab_size():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(TOKENIZER).get_vocab_size()


def architectures():
    """(name, config class, model class, config kwargs, save kwargs) per architecture."""
    from transformers import (MixtralConfig, MixtralForCausalLM, OlmoeConfig, OlmoeForCausalLM,
                              Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
    return [
        # Mixtral: a sliding window shorter than the first prompt, rope_theta 1e6.
        ("mixtral", MixtralConfig, MixtralForCausalLM,
         common(intermediate_size=16, num_local_experts=4, sliding_window=5,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6}), {}),
        # Qwen2-MoE: gated shared expert, q/k/v biases, a dense first layer,
        # un-renormalised top-k, tied embeddings; saved in shards.
        ("qwen2_moe", Qwen2MoeConfig, Qwen2MoeForCausalLM,
         common(vocab_size=tokenizer_vocab_size(), intermediate_size=24, moe_intermediate_size=16, shared_expert_intermediate_size=20,
                num_experts=4, mlp_only_layers=[0], norm_topk_prob=False, tie_word_embeddings=True,
                rms_norm_eps=1e-6), {"max_shard_size": "60KB"}),
        # Qwen3-MoE: per-head QK-norm, head_dim * heads != hidden_size,
        # attention biases, MoE every second layer, renormalised top-k.
        ("qwen3_moe", Qwen3MoeConfig, Qwen3MoeForCausalLM,
         common(intermediate_size=24, moe_intermediate_size=16, num_experts=4, head_dim=12,
                decoder_sparse_step=2, norm_topk_prob=True, attention_bias=True), {}),
        # OLMoE: QK-norm over the whole projection, no renormalisation, 3 of 6 experts.
        ("olmoe", OlmoeConfig, OlmoeForCausalLM,
         common(intermediate_size=16, num_experts=6, num_experts_per_tok=3, norm_topk_prob=False), {}),
    ]


def randomize(model, seed):
    """Weights that make every feature matter: O(1) logits, decisive routers,
    norms and biases away from their 1/0 initialisation."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif ".gate.weight" in name:  # routers
                p.copy_(1.0 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.25 * torch.randn(p.shape, generator=gen))


def greedy(model, prompt):
    """Greedy continuation and the smallest top-1/top-2 logit gap on the way."""
    import torch

    ids = torch.tensor([prompt])
    out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, output_scores=True,
                         return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    gaps = [float((s[0].topk(2).values[0] - s[0].topk(2).values[1])) for s in out.scores]
    return out.sequences[0, len(prompt):].tolist(), min(gaps)


def reference_outputs(model, extra_prompts=()):
    import torch

    logits, continuations, margin = {}, [], float("inf")
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            logits[f"logits.{i}"] = model(torch.tensor([prompt])).logits[0].float().contiguous()
        for prompt in PROMPTS + list(extra_prompts):
            tokens, gap = greedy(model, prompt)
            continuations.append(tokens)
            margin = min(margin, gap)
    return logits, continuations, margin


def text_prompt_ids(with_tokenizer):
    """The reference tokenizer's ids of TEXT_PROMPT (for the model that has one)."""
    if not with_tokenizer:
        return []
    from tokenizers import Tokenizer

    return Tokenizer.from_file(TOKENIZER).encode(TEXT_PROMPT).ids


def make_model(name, config_cls, model_cls, kwargs, save_kwargs):
    import torch
    from safetensors.torch import save_file

    out = os.path.join(OUT_DIR, name)
    with_tokenizer = kwargs["vocab_size"] != VOCAB
    text_ids = text_prompt_ids(with_tokenizer)
    # Reseed until greedy decoding never faces a near tie (the C++ test must
    # reproduce the argmax, so a tie within float noise would be a coin flip).
    for seed in range(1, 50):
        torch.manual_seed(seed)
        config = config_cls(**kwargs)
        config._attn_implementation = "eager"
        model = model_cls(config).eval()
        randomize(model, seed)
        logits, continuations, margin = reference_outputs(model, [text_ids] if text_ids else [])
        if margin > 1e-2:
            break
    else:
        sys.exit(f"{name}: no seed gave decisive greedy steps")
    shutil.rmtree(out, ignore_errors=True)
    model.save_pretrained(out, **save_kwargs)
    save_file(logits, os.path.join(out, "reference.safetensors"))
    record = {"architecture": config.architectures[0] if config.architectures else model_cls.__name__,
              "seed": seed, "prompts": PROMPTS, "new_tokens": NEW_TOKENS,
              "greedy": continuations[:len(PROMPTS)], "min_greedy_margin": margin}
    if with_tokenizer:
        shutil.copy(TOKENIZER, os.path.join(out, "tokenizer.json"))
        record.update(text_prompt=TEXT_PROMPT, text_prompt_ids=text_ids, text_greedy=continuations[-1])
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"{name}: seed {seed}, greedy margin {margin:.3g}, {size / 1024:.0f} KiB in {out}")
    return model


def check_export(name, model_cls, moerl):
    """import-hf -> export-hf with moerl, then the reference library loads the
    export: the same weights bit for bit as the fixture, and the recorded
    logits (to float rounding: BLAS may take other paths for other buffer
    addresses) and greedy continuations."""
    import torch
    from safetensors.torch import load_file

    src = os.path.join(OUT_DIR, name)
    ref = load_file(os.path.join(src, "reference.safetensors"))
    expected = json.load(open(os.path.join(src, "reference.json")))
    original = model_cls.from_pretrained(src, attn_implementation="eager").eval().state_dict()
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "run.toml")
        with open(config, "w") as f:
            f.write(f'[model]\nsource = "hf:{src}"\n')
        store, out = os.path.join(tmp, "ckpt"), os.path.join(tmp, "export")
        subprocess.check_call([moerl, "checkpoint", "import-hf", store, "1", "--config", config])
        subprocess.check_call([moerl, "checkpoint", "export-hf", store, "1", out, "--shard-mb", "0.05"])
        model = model_cls.from_pretrained(out, attn_implementation="eager").eval()
        logits, continuations, _ = reference_outputs(model)
        copied_tokenizer = os.path.exists(os.path.join(out, "tokenizer.json"))
    if copied_tokenizer != ("text_prompt" in expected):
        sys.exit(f"{name}: export-hf did not copy tokenizer.json")
    exported = model.state_dict()
    differing = [k for k in original if k not in exported or not torch.equal(original[k], exported[k])]
    if differing or set(exported) != set(original):
        sys.exit(f"{name}: the export's weights differ from the fixture's: {differing[:5]}")
    worst = max(float((logits[k] - ref[k]).abs().max() / ref[k].abs().max()) for k in ref)
    if worst > 1e-5 or continuations != expected["greedy"]:
        sys.exit(f"{name}: the export does not reproduce the reference (max relative |dlogit| {worst}, "
                 f"greedy {continuations} vs {expected['greedy']})")
    print(f"{name}: moerl's export loads in transformers with the fixture's weights bit for bit "
          f"(logits within {worst:.1e} relative, greedy identical)")


def main():
    args = parse_args()
    ensure_venv(args)
    import torch

    torch.set_num_threads(1)
    for name, config_cls, model_cls, kwargs, save_kwargs in architectures():
        make_model(name, config_cls, model_cls, kwargs, save_kwargs)
    if args.moerl:
        for name, _, model_cls, _, _ in architectures():
            check_export(name, model_cls, os.path.abspath(args.moerl))


if __name__ == "__main__":
    main()
