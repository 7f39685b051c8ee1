"""A plain, hand-written GRPO update in PyTorch on the exported weights, on
the batch `moerl bench update --write-batch FILE` wrote (the same tokens,
generated masks, behaviour log-probs and advantages), with the settings
written beside it: micro-batches, the clipped ratio loss with truncated
importance weights (decoupled PPO), the loss normalisation, the MoE
load-balancing and router z-losses, gradient clipping and AdamW with the
same learning rate and betas. It reports the milliseconds of each update
and the first update's policy loss (moerl's first_loss: the two should
agree, which says both train on the same thing).

    python grpo_update.py --model DIR --batch batch.json --threads 1 > peer_update.json

Prints one JSON object: {"cases": [{"episodes", "tokens", "threads", "ms",
"min_ms", "tokens_per_s", "first_loss"}]} (ms: the median update).
"""

import argparse
import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM


def padded(episodes):
    """Right-padded [B, S] inputs, targets, generated mask, behaviour
    log-probs and attention mask; a row is an episode's tokens[:-1] and
    predicts tokens[1:]."""
    width = max(len(e["tokens"]) for e in episodes) - 1
    shape = (len(episodes), width)
    inputs = torch.zeros(shape, dtype=torch.long)
    targets = torch.zeros(shape, dtype=torch.long)
    mask = torch.zeros(shape)
    behaviour = torch.zeros(shape)
    attention = torch.zeros(shape, dtype=torch.long)
    for row, e in enumerate(episodes):
        n = len(e["tokens"]) - 1
        inputs[row, :n] = torch.tensor(e["tokens"][:-1])
        targets[row, :n] = torch.tensor(e["tokens"][1:])
        mask[row, :n] = torch.tensor(e["generated"][1:], dtype=torch.float32)
        behaviour[row, :n] = torch.tensor(e["behaviour_logprobs"][1:])
        attention[row, :n] = 1
    return inputs, targets, mask, behaviour, attention


def micro_batches(batch):
    episodes = batch["episodes"]
    n = len(episodes)
    chunks = max(1, min(int(batch["grad_accumulation"]), n))
    out = []
    for c in range(chunks):
        part = episodes[n * c // chunks : n * (c + 1) // chunks]
        tensors = padded(part)
        advantages = torch.tensor([e["advantage"] for e in part])
        out.append((tensors, advantages))
    return out


def policy_loss(logp, behaviour, mask, advantages, batch, total_sequences, total_tokens):
    """The clipped surrogate with truncated importance weights, normalised
    over the whole batch (so the micro-batches' gradients sum to the
    full batch's)."""
    weight = torch.exp(logp.detach() - behaviour).clamp(max=batch["importance_cap"])
    ratio = torch.exp(logp - logp.detach())
    a = advantages[:, None]
    clipped = ratio.clamp(1 - batch["clip_low"], 1 + batch["clip_high"])
    per_token = -weight * torch.minimum(ratio * a, clipped * a) * mask
    if batch["normalization"] == "sequence":
        per_sequence = per_token.sum(1) / mask.sum(1).clamp(min=1)
        return per_sequence.sum() / total_sequences
    if batch["normalization"] == "token":
        return per_token.sum() / total_tokens
    return per_token.sum() / (total_sequences * batch["max_tokens_per_episode"])


def router_losses(router_logits, experts, top_k):
    """Switch-style load balancing (fraction routed x mean probability, per
    layer, times the experts) and the router z-loss, averaged over layers."""
    balance, z = 0.0, 0.0
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)
        chosen = torch.topk(probs, top_k, dim=-1).indices
        routed = torch.zeros_like(probs).scatter_(1, chosen, 1.0).mean(0) / top_k
        balance = balance + experts * (routed * probs.mean(0)).sum()
        z = z + torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
    layers = len(router_logits)
    return balance / layers, z / layers


def make_update(model, batch):
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=batch["lr"],
        betas=(batch["beta1"], batch["beta2"]),
        weight_decay=batch["weight_decay"],
    )
    chunks = micro_batches(batch)
    total_sequences = sum(int((t[2].sum(1) > 0).sum()) for t, _ in chunks)
    total_tokens = sum(float(t[2].sum()) for t, _ in chunks)
    experts = model.config.num_local_experts if hasattr(model.config, "num_local_experts") else model.config.num_experts
    top_k = model.config.num_experts_per_tok
    moe_terms = batch["aux_loss_weight"] > 0 or batch["z_loss_weight"] > 0

    def update():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss_value = 0.0
        for (inputs, targets, mask, behaviour, attention), advantages in chunks:
            out = model(input_ids=inputs, attention_mask=attention, output_router_logits=moe_terms, use_cache=False)
            logp = torch.log_softmax(out.logits.float(), dim=-1).gather(-1, targets[..., None]).squeeze(-1)
            loss = policy_loss(logp, behaviour, mask, advantages, batch, total_sequences, total_tokens)
            loss_value += float(loss.detach())
            if moe_terms:
                balance, z = router_losses(out.router_logits, experts, top_k)
                loss = loss + (batch["aux_loss_weight"] * balance + batch["z_loss_weight"] * z) / len(chunks)
            loss.backward()
        if batch["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), batch["grad_clip"])
        optimizer.step()
        return loss_value

    return update


def load_model(path):
    model, loading = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    # The export must be complete: a missing weight would be initialised at random.
    if loading["missing_keys"] or loading["unexpected_keys"]:
        raise SystemExit(f"grpo_update: {path} does not load cleanly: missing {loading['missing_keys']}, "
                         f"unexpected {loading['unexpected_keys']}")
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the export-hf directory")
    parser.add_argument("--batch", required=True, help="moerl bench update --write-batch JSON")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model = load_model(args.model)
    with open(args.batch) as f:
        batch = json.load(f)
    update = make_update(model, batch)
    first_loss = update()  # also the warm-up: the first calls allocate
    seconds = []
    for _ in range(args.reps):
        start = time.perf_counter()
        update()
        seconds.append(time.perf_counter() - start)
    tokens = sum(len(e["tokens"]) for e in batch["episodes"])
    median = statistics.median(seconds)
    case = {"episodes": len(batch["episodes"]), "tokens": tokens, "threads": args.threads, "ms": median * 1e3,
            "min_ms": min(seconds) * 1e3, "tokens_per_s": tokens / median, "first_loss": first_loss}
    print(f"grpo_update: {case['ms']:.1f} ms (min {case['min_ms']:.1f}), first loss {first_loss:.6f}", file=sys.stderr)
    print(json.dumps({"cases": [case]}))

if __name__ == "__main__":
    main()
