"""Batched decode with a KV cache in transformers: the peer of `moerl bench rollout`.

Same measure as moerl's (benchmarks/decode_timing.cpp): every session gets a
prompt of `context` tokens, one prefill step samples the first token, two
warm-up steps follow, then `steps` timed decode steps of one token per session
(greedy, as moerl's benchmark). tokens/s = sessions x steps / the timed steps.
Prints one JSON object: {"cases": [{"sessions", "context", "steps", "threads", "tokens_per_s"}]}.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM

WARMUP_STEPS = 2


def prompt_tokens(sessions, context, vocab):
    # Deterministic prompts of ordinary (non-special) tokens; what they say does not matter here.
    generator = torch.Generator().manual_seed(sessions * 1000 + context)
    return torch.randint(3, vocab, (sessions, context), generator=generator)


@torch.no_grad()
def decode_tokens_per_s(model, sessions, context, steps):
    tokens = prompt_tokens(sessions, context, model.config.vocab_size)
    out = model(input_ids=tokens, use_cache=True)
    past = out.past_key_values
    next_token = out.logits[:, -1, :].argmax(-1, keepdim=True)
    for _ in range(WARMUP_STEPS):
        out = model(input_ids=next_token, past_key_values=past, use_cache=True)
        past, next_token = out.past_key_values, out.logits[:, -1, :].argmax(-1, keepdim=True)
    start = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=next_token, past_key_values=past, use_cache=True)
        past, next_token = out.past_key_values, out.logits[:, -1, :].argmax(-1, keepdim=True)
    return sessions * steps / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a directory written by `moerl checkpoint export-hf`")
    parser.add_argument("--sessions", default="1,4,16,64,256")
    parser.add_argument("--contexts", default="64,512")
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--threads", type=int, required=True)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model, loading = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, output_loading_info=True)
    # The export must be complete: a missing weight would be initialised at random and decode as fast.
    if loading["missing_keys"] or loading["unexpected_keys"]:
        raise SystemExit(f"peer_decode: {args.model} does not load cleanly: missing {loading['missing_keys']}, "
                         f"unexpected {loading['unexpected_keys']}")
    model.eval()
    cases = []
    for context in [int(c) for c in args.contexts.split(",")]:
        if context + WARMUP_STEPS + args.steps + 1 >= model.config.max_position_embeddings:
            continue  # moerl's benchmark skips it too
        for sessions in [int(s) for s in args.sessions.split(",")]:
            cases.append({"sessions": sessions, "context": context, "steps": args.steps, "threads": args.threads,
                          "tokens_per_s": decode_tokens_per_s(model, sessions, context, args.steps),
                          "experts_implementation": getattr(model.config, "_experts_implementation", None)})
    print(json.dumps({"cases": cases}))


if __name__ == "__main__":
    main()
