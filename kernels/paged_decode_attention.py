"""Single-token decode attention over the paged KV cache, split along the context when the batch
alone cannot fill the device (FlashDecoding).

One program per (sequence, kv head) reads the K/V tiles once for the whole GQA group. At batch 1 on
an 8B model that is 8 programs on a 132-SM GPU, each walking 2k tokens alone, which leaves most of
the memory bandwidth unused. So each sequence's context is cut into `num_splits` equal parts, each
program writes an unnormalised partial result with its running max and denominator, and a second
kernel merges the parts. The split count depends only on the batch size, never on context lengths,
so a CUDA graph captured for a batch bucket stays valid for every step it replays.
"""
import functools
import math

import torch
import triton
import triton.language as tl

from baton.kernels.paged_kv_tile import load_kv_tile, online_softmax_update

# KV tokens per loop step; independent of the cache block size because every token's
# address is gathered through the block table. 32 tokens with 4 warps compiles without
# register spills for head_dim 128 on sm_90 in both fp32 and bf16; 64 tokens spill.
_BLOCK_N = 32
_NUM_WARPS = 4
# tl.dot needs at least 16 rows; the group's query heads are padded up to that.
_MIN_DOT_ROWS = 16
# Splits aim for this many programs per SM (4 warps each: enough loads in flight to hide HBM
# latency) and stop at MAX_SPLITS, which keeps a 2k-token context at 64 tokens (two tiles) per
# split. Both unmeasured on a GPU yet (docs/gpu-checks.md).
PROGRAMS_PER_SM = 4
MAX_SPLITS = 32


@triton.jit
def _decode_kernel(
    q_ptr, cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr, part_acc_ptr, part_m_ptr,
    part_l_ptr, stride_qs, stride_qh, stride_os, stride_oh, stride_bt,
    stride_cb, stride_ckv, stride_co, stride_ch,
    scale_log2, num_q_heads,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    # One program per (sequence, kv head, split) so the K/V tiles are read once for the whole
    # GQA group, which is what bounds decode speed.
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    ctx_len = tl.load(context_lens_ptr + seq)
    # Whole tiles per split, so only the last tile of a context is ever partial.
    span = tl.cdiv(tl.cdiv(ctx_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    begin = split * span
    end = tl.minimum(ctx_len, begin + span)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g
    d_mask = d < HEAD_DIM
    q_mask = (g < GROUP)[:, None] & d_mask[None, :]
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :], mask=q_mask,
                other=0.0)
    if UPCAST:  # the interpreter treats bf16 as raw uint16, so it must compute in fp32
        q = q.to(tl.float32)

    k_base = cache_ptr + kv_head * stride_ch
    table = block_tables_ptr + seq * stride_bt
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    # Each step has at least one valid token, so m_i is finite after the first and no NaN arises.
    for start in range(begin, end, BLOCK_N):
        n, n_mask, k_t, v = load_kv_tile(k_base, table, start, end, d, d_mask, stride_cb,
                                         stride_ckv, stride_co, BLOCK_N, BLOCK_SIZE, UPCAST)
        s = tl.dot(q, k_t, input_precision="ieee") * scale_log2
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_i, l_i, acc = online_softmax_update(s, v, m_i, l_i, acc)

    if NUM_SPLITS == 1:
        # An empty context (a padded batch slot) yields zeros rather than 0/0.
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        out_ptrs = out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :]
        tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        part = (seq * num_q_heads + heads) * NUM_SPLITS + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=q_mask)
        tl.store(part_m_ptr + part, m_i, mask=g < GROUP)
        tl.store(part_l_ptr + part, l_i, mask=g < GROUP)


@triton.jit
def _merge_kernel(
    part_acc_ptr, part_m_ptr, part_l_ptr, out_ptr, stride_os, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # One program per (sequence, query head): rescales every split to the common max, then divides
    # once by the common denominator.
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < NUM_SPLITS
    d_mask = d < HEAD_DIM
    part = (seq * tl.num_programs(1) + head) * NUM_SPLITS + s
    m = tl.load(part_m_ptr + part, mask=s_mask, other=float("-inf"))
    l = tl.load(part_l_ptr + part, mask=s_mask, other=0.0)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :],
                  mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    m_max = tl.max(m, 0)
    # Splits past the context (and every split of an empty context) have m = -inf: weight 0.
    weight = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))
    total = tl.sum(l * weight, 0)
    out = tl.sum(acc * weight[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d, out.to(out_ptr.dtype.element_ty),
             mask=d_mask)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_splits(num_seqs: int, num_kv_heads: int, sm_count: int) -> int:
    """How many parts each context is cut into: enough for PROGRAMS_PER_SM programs on every SM;
    1 without SMs (the interpreter gains nothing from splitting)."""
    wanted = -(-PROGRAMS_PER_SM * sm_count // (num_seqs * num_kv_heads))
    return max(1, min(MAX_SPLITS, wanted))


def paged_decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Attend query [S, Hq, D] (one token per sequence) to the first context_lens[s] cached
    tokens; num_splits defaults to decode_splits()."""
    num_seqs, num_q_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    group = num_q_heads // num_kv_heads
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_seqs == 0:
        return out
    assert query.stride(-1) == 1 and kv_cache.stride(-1) == 1 and block_tables.stride(-1) == 1
    sm_count = _sm_count(query.device) if query.is_cuda else 0
    splits = num_splits or decode_splits(num_seqs, num_kv_heads, sm_count)
    # Partial results, [S, Hq, splits] (x D for the accumulators). Unsplit, the kernel never touches
    # them, so out stands in rather than allocating per layer and step.
    part_acc = part_m = part_l = out
    if splits > 1:
        parts = (num_seqs, num_q_heads, splits)
        part_acc = torch.empty((*parts, head_dim), dtype=torch.float32, device=query.device)
        part_m, part_l = torch.empty((2, *parts), dtype=torch.float32, device=query.device)
    block_d = max(16, triton.next_power_of_2(head_dim))
    _decode_kernel[(num_seqs, num_kv_heads, splits)](
        query, kv_cache, block_tables, context_lens, out, part_acc, part_m, part_l,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        scale * math.log2(math.e), num_q_heads,
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=kv_cache.shape[2],
        BLOCK_G=max(_MIN_DOT_ROWS, triton.next_power_of_2(group)), BLOCK_N=_BLOCK_N,
        BLOCK_D=block_d, UPCAST=triton.knobs.runtime.interpret, NUM_SPLITS=splits,
        num_warps=_NUM_WARPS,
    )
    if splits > 1:
        _merge_kernel[(num_seqs, num_q_heads)](
            part_acc, part_m, part_l, out, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, NUM_SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits),
            BLOCK_D=block_d,
        )
    return out
