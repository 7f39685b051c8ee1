"""One MoE layer's forward+backward in transformers: the peer of `moerl bench moe`.

Reads the shapes from moerl's own JSON (`moerl bench moe --out F`): for each
`layer_fwd_bwd` case without shared experts, transformers' Mixtral sparse MoE
block (with the experts implementation from_pretrained picks by default, grouped_mm) with the same hidden size, expert
width, number of experts and top-k, on the same number of tokens and threads:
forward, a loss against a fixed random gradient, backward; the median of the
timed repetitions, as tokens/s.
Prints one JSON object: {"cases": [{"tokens", "hidden", "experts", "d_expert", "top_k", "threads", "tokens_per_s"}]}.
"""
import argparse
import json
import statistics
import time

import torch
from transformers import MixtralConfig
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

EXPERTS_IMPLEMENTATION = "grouped_mm"


def fwd_bwd_tokens_per_s(case, warmup, reps):
    config = MixtralConfig(hidden_size=case["hidden"], intermediate_size=case["d_expert"],
                           num_local_experts=case["experts"], num_experts_per_tok=case["top_k"])
    # What from_pretrained selects by default; a block built standalone would
    # otherwise run the per-expert loop (measured 4x slower at E=64).
    config._experts_implementation = EXPERTS_IMPLEMENTATION
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(config)
    for p in block.parameters():
        torch.nn.init.normal_(p, std=0.02)
    x = torch.randn(1, case["tokens"], case["hidden"], requires_grad=True)
    dy = torch.randn(1, case["tokens"], case["hidden"])
    times = []
    for r in range(warmup + reps):
        start = time.perf_counter()
        out = block(x)
        y = out[0] if isinstance(out, tuple) else out
        (y * dy).sum().backward()
        if r >= warmup:
            times.append(time.perf_counter() - start)
        block.zero_grad(set_to_none=True)
        x.grad = None
    return case["tokens"] / statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moerl-json", required=True, help="the output of `moerl bench moe --out F`")
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()

    with open(args.moerl_json) as f:
        moerl = json.load(f)
    cases = []
    for c in moerl["cases"]:
        p = c["params"]
        if c["name"] != "layer_fwd_bwd" or p.get("shared", 0) != 0:
            continue
        if torch.get_num_threads() != p["threads"]:
            # As moerl's side does: set_num_threads re-creates the pthreadpool,
            # whose new worker spins for a while; let it settle before timing.
            torch.set_num_threads(p["threads"])
            time.sleep(0.3)
        shape = {k: p[k] for k in ("tokens", "hidden", "experts", "d_expert", "top_k", "threads")}
        cases.append(dict(shape, tokens_per_s=fwd_bwd_tokens_per_s(shape, warmup=2, reps=args.reps),
                          experts_implementation=EXPERTS_IMPLEMENTATION))
    print(json.dumps({"cases": cases}))


if __name__ == "__main__":
    main()
