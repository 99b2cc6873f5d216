"""The figures of docs/sizing.md, computed: Llama-3-70B in bf16 on H100 80 GB GPUs at each
tensor-parallel size. `python3 docs/sizing.py` prints the tables that docs/sizing.md carries between
its `sizing:` markers (the network table is in docs/multi-node.md); tests/test_sizing_doc.py fails
when the pages and this script disagree.

Sharding as vLLM (and Megatron) do it: q/k/v and gate/up split by output rows, o and down by input
columns, embedding and LM head by vocabulary rows, norms replicated; K and V heads split over ranks
while there are at least as many as ranks, else each rank keeps one (replicated).
"""
from __future__ import annotations

from dataclasses import dataclass

MIB, GIB = 1 << 20, 1 << 30


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    dtype_bytes: int = 2  # bf16


LLAMA_3_70B = Shape(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
                    intermediate=28672, vocab=128256)
TP_SIZES = (1, 2, 4, 8, 16)
GPUS_PER_NODE = 8
# What nvidia-smi reports as the total of an H100 80GB HBM3 (SXM): 81,559 MiB.
H100_BYTES = 81_559 * MIB
H100_HBM_BYTES_PER_S = 3.35e12
H100_BF16_FLOPS = 989e12  # dense
# The engine's defaults (services/engine/config.py): --gpu-memory-utilization, --block-size, and
# what its activation reserve is sized from (--max-num-batched-tokens, --max-num-seqs, the largest
# CUDA-graph batch).
UTILIZATION, BLOCK_TOKENS = 0.9, 16
BATCHED_TOKENS, MAX_SEQS, GRAPH_BATCH = 2048, 256, 256
# Per rank: CUDA context, NCCL buffers and allocator slack. An allowance, not a measurement.
CONTEXT_BYTES = 1 * GIB
# Prefill runs at this share of the dense peak (model FLOPs utilization). An assumption.
PREFILL_MFU = 0.5
# Decode replicas are sized to stay under the autoscaler's default kvCacheHighPercent.
KV_HIGH = 0.85
# Link rates per GPU: NVLink 4 on an HGX H100, and one 400 Gb/s NIC per GPU between nodes.
NVLINK_BYTES_PER_S, NETWORK_BYTES_PER_S = 450e9, 50e9


def parameters(s: Shape) -> dict[str, int]:
    """Parameter counts by how they shard."""
    q_o = 2 * s.hidden * s.heads * s.head_dim
    k_v = 2 * s.hidden * s.kv_heads * s.head_dim
    mlp = 3 * s.hidden * s.intermediate
    return {"split": s.layers * (q_o + mlp) + 2 * s.vocab * s.hidden, "kv": s.layers * k_v,
            "replicated": s.layers * 2 * s.hidden + s.hidden}


def kv_heads_per_rank(s: Shape, tp: int) -> int:
    return max(1, s.kv_heads // tp)


def weight_bytes_per_rank(s: Shape, tp: int) -> int:
    p = parameters(s)
    kv = p["kv"] * kv_heads_per_rank(s, tp) // s.kv_heads
    return (p["split"] // tp + kv + p["replicated"]) * s.dtype_bytes


def kv_bytes_per_token_per_rank(s: Shape, tp: int) -> int:
    """K and V of every layer for one token, on one rank."""
    return 2 * s.layers * kv_heads_per_rank(s, tp) * s.head_dim * s.dtype_bytes


def activation_reserve(s: Shape, tp: int) -> int:
    """The engine's bound on one step's transient memory (services/engine/kv/kv_cache.py), on a
    rank: its shard of the MLP's activations, full-width hidden states and full-vocabulary
    logits."""
    per_token = (3 * s.intermediate // tp + 6 * s.hidden) * s.dtype_bytes
    logits = MAX_SEQS * s.vocab * 4 * 4
    return BATCHED_TOKENS * per_token + logits + min(GRAPH_BATCH, MAX_SEQS) * per_token


def kv_budget_per_rank(s: Shape, tp: int) -> int:
    """What the KV cache gets: the utilization share of the card less weights, context and the
    activation reserve (negative: the model does not fit)."""
    return (int(H100_BYTES * UTILIZATION) - weight_bytes_per_rank(s, tp) - CONTEXT_BYTES -
            activation_reserve(s, tp))


def blocks_per_rank(s: Shape, tp: int) -> int:
    return max(0, kv_budget_per_rank(s, tp)) // (BLOCK_TOKENS * kv_bytes_per_token_per_rank(s, tp))


def tokens_per_node(s: Shape, tp: int) -> int:
    """KV capacity of one node's GPUs: replicas per node times tokens per replica."""
    return blocks_per_rank(s, tp) * BLOCK_TOKENS * GPUS_PER_NODE // tp


def gib(n: float) -> str:
    return f"{n / GIB:,.1f}"


def memory_table(s: Shape) -> str:
    rows = ["| TP | weights per rank (GiB) | KV heads per rank | KV per token per rank (KiB) "
            "| activation reserve (GiB) | KV budget per rank (GiB) | blocks per rank "
            "| tokens per replica | tokens per 8-GPU node |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for tp in TP_SIZES:
        budget = kv_budget_per_rank(s, tp)
        fits = budget > 0
        rows.append(
            f"| {tp} | {gib(weight_bytes_per_rank(s, tp))} | {kv_heads_per_rank(s, tp)} | "
            f"{kv_bytes_per_token_per_rank(s, tp) // 1024} | {gib(activation_reserve(s, tp))} | "
            f"{gib(budget) if fits else 'does not fit'} | {blocks_per_rank(s, tp):,} | "
            f"{blocks_per_rank(s, tp) * BLOCK_TOKENS:,} | {tokens_per_node(s, tp):,} |")
    return "\n".join(rows)


def decode_step_floor_ms(s: Shape, tp: int, batch: int, context: int) -> float:
    """A decode step reads every weight and every cached token of the batch once: its time on
    HBM bandwidth alone, before any all-reduce."""
    read = weight_bytes_per_rank(s, tp) + batch * context * kv_bytes_per_token_per_rank(s, tp)
    return read / H100_HBM_BYTES_PER_S * 1000


def prefill_seconds(s: Shape, tp: int, prompt: int) -> float:
    """A prompt's FLOPs (2 per parameter per token, plus causal attention) over tp GPUs at
    PREFILL_MFU of the dense peak."""
    p = parameters(s)
    # The embedding is a lookup; the LM head runs for the last position only.
    head = s.vocab * s.hidden
    linear = 2 * (p["split"] - 2 * head + p["kv"]) * prompt + 2 * head
    attention = 2 * s.layers * prompt * prompt * s.heads * s.head_dim
    return (linear + attention) / (tp * H100_BF16_FLOPS * PREFILL_MFU)


def speed_table(s: Shape) -> str:
    rows = ["| TP | decode step floor, 64 x 4k context (ms) | decode step floor, 256 x 4k context "
            "(ms) | prefill of a 2k prompt (s) | prefill of an 8k prompt (s) |",
            "|---:|---:|---:|---:|---:|"]
    for tp in TP_SIZES[2:]:
        rows.append(
            f"| {tp} | {decode_step_floor_ms(s, tp, 64, 4096):.1f} | "
            f"{decode_step_floor_ms(s, tp, 256, 4096):.1f} | "
            f"{prefill_seconds(s, tp, 2048):.2f} | {prefill_seconds(s, tp, 8192):.2f} |")
    return "\n".join(rows)


def pool_table(s: Shape) -> str:
    rows = ["| TP | replicas per 8-GPU node | decode: 4k-context sequences per replica (85% of KV) "
            "| per node | prefill: prompt tokens/s per replica (2k prompts) | per node |",
            "|---:|---:|---:|---:|---:|---:|"]
    for tp in TP_SIZES[2:4]:
        per_node = GPUS_PER_NODE // tp
        sequences = int(blocks_per_rank(s, tp) * BLOCK_TOKENS * KV_HIGH) // 4096
        prefill = 2048 / prefill_seconds(s, tp, 2048)
        rows.append(f"| {tp} | {per_node} | {sequences:,} | {sequences * per_node:,} | "
                    f"{prefill:,.0f} | {prefill * per_node:,.0f} |")
    return "\n".join(rows)


def allreduce_bytes_per_step(s: Shape, tp: int, batch: int) -> float:
    """What each GPU sends in a decode step: two ring all-reduces per layer (after attention and
    after the MLP) of the batch's hidden states."""
    return 2 * s.layers * 2 * (tp - 1) / tp * batch * s.hidden * s.dtype_bytes


def network_table(s: Shape) -> str:
    rows = ["| placement | TP | all-reduce traffic per decode step per GPU, batch 64 (MiB) "
            "| on NVLink (ms) | over the network (ms) |", "|---|---:|---:|---:|---:|"]
    for placement, tp, spans in (("one node of 8", 8, False), ("two nodes of 4", 8, True),
                                 ("two nodes of 8", 16, True)):
        sent = allreduce_bytes_per_step(s, tp, 64)
        network = f"{sent / NETWORK_BYTES_PER_S * 1000:.1f}" if spans else "-"
        rows.append(f"| {placement} | {tp} | {sent / MIB:,.0f} | "
                    f"{sent / NVLINK_BYTES_PER_S * 1000:.2f} | {network} |")
    return "\n".join(rows)


def model_table(s: Shape) -> str:
    total = sum(parameters(s).values())
    return "\n".join([
        "| parameters | bf16 weights | KV per token (all layers, K and V) | one 16-token block |",
        "|---:|---:|---:|---:|",
        f"| {total:,} | {total * s.dtype_bytes / 1e9:,.1f} GB ({gib(total * s.dtype_bytes)} GiB) | "
        f"{kv_bytes_per_token_per_rank(s, 1):,} bytes ({kv_bytes_per_token_per_rank(s, 1) // 1024}"
        f" KiB) | {BLOCK_TOKENS * kv_bytes_per_token_per_rank(s, 1) / MIB:.0f} MiB |"])


def tables() -> dict[str, str]:
    """Marker name (in docs/sizing.md and docs/multi-node.md) -> the table it holds."""
    return {"model": model_table(LLAMA_3_70B), "memory": memory_table(LLAMA_3_70B),
            "speed": speed_table(LLAMA_3_70B), "pools": pool_table(LLAMA_3_70B),
            "network": network_table(LLAMA_3_70B)}


if __name__ == "__main__":
    for name, table in tables().items():
        print(f"<!-- sizing:{name} -->\n{table}\n<!-- /sizing:{name} -->\n")
