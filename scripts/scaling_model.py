#!/usr/bin/env python3
"""Expert-parallel cost model of docs/scaling.md: per GPU and per training step,
the all-to-all bytes and time of the MoE layers, the expert GEMM time they
sit beside, and the expert memory, for Mixtral-8x7B and Qwen3-30B-A3B at a
few GPU counts. Standard library only.

    python3 scripts/scaling_model.py [--tokens N] [--tflops F]

Every assumption is a named constant or option below; docs/scaling.md lists them.
"""
import argparse
from dataclasses import dataclass

GPUS_PER_NODE = 8
# Vendor figures. NVLink 4 on H100 SXM: 900 GB/s per GPU, both directions
# together, so 450 GB/s each way. InfiniBand NDR: 400 Gb/s per port and
# direction = 50 GB/s; one port per GPU, as in a DGX H100.
NVLINK_GBPS_ONE_WAY = 450.0
NDR_GBPS_ONE_WAY = 50.0
ACTIVATION_BYTES = 2  # bf16 rows on the wire
# Mixed-precision Adam per parameter: bf16 weight and gradient, then fp32
# master weight and two fp32 moments. The table shows them whole on every
# replica, and (ZeRO-1) sharded over the DP replicas of the same experts.
WEIGHT_GRAD_BYTES = 2 + 2
OPTIMIZER_BYTES = 4 + 4 + 4


@dataclass
class MoeModel:
    name: str
    layers: int
    d_model: int
    experts: int
    top_k: int
    d_expert: int  # one expert's SwiGLU hidden size

    def expert_params(self) -> float:
        return self.layers * self.experts * 3 * self.d_model * self.d_expert


MODELS = [
    MoeModel("Mixtral-8x7B", layers=32, d_model=4096, experts=8, top_k=2, d_expert=14336),
    MoeModel("Qwen3-30B-A3B", layers=48, d_model=2048, experts=128, top_k=8, d_expert=768),
]


def exchange_bytes(m: MoeModel, tokens: int, ep: int) -> tuple[float, float]:
    """Bytes one GPU sends per step in the all-to-alls (it receives as many):
    (to GPUs of its node, to other nodes). Per MoE layer, dispatch and combine
    each move tokens*top_k rows of d_model in forward, and again in backward;
    under uniform routing a row stays on this GPU with probability 1/ep."""
    rows = 4 * m.layers * tokens * m.top_k * m.d_model * ACTIVATION_BYTES
    in_node = min(ep, GPUS_PER_NODE)
    return rows * (in_node - 1) / ep, rows * (ep - in_node) / ep


def exchange_seconds(m: MoeModel, tokens: int, ep: int) -> float:
    """Link-rate time: NVLink and InfiniBand run at the same time, so the
    slower of the two bounds the exchange (no protocol overhead counted)."""
    nvlink, infiniband = exchange_bytes(m, tokens, ep)
    return max(nvlink / (NVLINK_GBPS_ONE_WAY * 1e9), infiniband / (NDR_GBPS_ONE_WAY * 1e9))


def expert_gemm_seconds(m: MoeModel, tokens: int, tflops: float) -> float:
    """Routed-expert GEMMs per GPU per step: 3 matrices of d_model x d_expert
    per chosen expert, 2 FLOPs per multiply-add, backward twice forward."""
    flops = 3 * 2 * 3 * m.d_model * m.d_expert * m.top_k * tokens * m.layers
    return flops / (tflops * 1e12)


def expert_parallel_sizes(m: MoeModel, gpus: int) -> list[int]:
    """Within a node (8), and as wide as the experts allow when that differs."""
    sizes = [min(GPUS_PER_NODE, m.experts, gpus)]
    widest = min(gpus, m.experts)
    if widest != sizes[0]:
        sizes.append(widest)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per GPU per step (default 16384)")
    parser.add_argument("--tflops", type=float, default=400.0,
                        help="achieved bf16 TFLOP/s of the expert GEMMs (default 400, ~40%% of H100 SXM's dense peak)")
    parser.add_argument("--gpus", default="8,64,512", help="GPU counts (default 8,64,512)")
    args = parser.parse_args()
    gpu_counts = [int(g) for g in args.gpus.split(",")]

    print(f"tokens/GPU/step {args.tokens}, expert GEMMs at {args.tflops:g} TFLOP/s, bf16 rows; "
          f"NVLink {NVLINK_GBPS_ONE_WAY:g} GB/s and NDR {NDR_GBPS_ONE_WAY:g} GB/s per GPU each way")
    header = (f"{'model':<14} {'GPUs':>5} {'EP':>4} {'DP':>4} {'a2a GB/GPU':>10} {'off-node':>8} "
              f"{'a2a s':>7} {'GEMM s':>7} {'a2a/GEMM':>8} {'W+G GB':>7} {'Adam GB':>8} {'ZeRO-1 GB':>9}")
    print(header)
    print("-" * len(header))
    for m in MODELS:
        per_gpu_gemm = expert_gemm_seconds(m, args.tokens, args.tflops)
        for gpus in gpu_counts:
            for ep in expert_parallel_sizes(m, gpus):
                nvlink, infiniband = exchange_bytes(m, args.tokens, ep)
                seconds = exchange_seconds(m, args.tokens, ep)
                params = m.expert_params() / ep
                off_node = infiniband / (nvlink + infiniband) if nvlink + infiniband else 0
                print(f"{m.name:<14} {gpus:>5} {ep:>4} {gpus // ep:>4} {(nvlink + infiniband) / 1e9:>10.1f} "
                      f"{off_node:>8.0%} {seconds:>7.3f} {per_gpu_gemm:>7.3f} {seconds / per_gpu_gemm:>8.2f} "
                      f"{params * WEIGHT_GRAD_BYTES / 1e9:>7.1f} {params * OPTIMIZER_BYTES / 1e9:>8.1f} "
                      f"{params * (WEIGHT_GRAD_BYTES + OPTIMIZER_BYTES / (gpus // ep)) / 1e9:>9.1f}")
    print("expert parameters:", ", ".join(f"{m.name} {m.expert_params() / 1e9:.1f}B" for m in MODELS))


if __name__ == "__main__":
    main()
