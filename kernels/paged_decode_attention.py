"""Single-token decode attention over the paged KV cache."""
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


@triton.jit
def _decode_kernel(
    q_ptr, cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr,
    stride_qs, stride_qh, stride_os, stride_oh, stride_bt,
    stride_cb, stride_ckv, stride_co, stride_ch,
    scale_log2,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
):
    # One program per (sequence, kv head) so the K/V tiles are read once for the whole
    # GQA group, which is what bounds decode speed.
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    ctx_len = tl.load(context_lens_ptr + seq)

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
    for start in range(0, ctx_len, BLOCK_N):
        n, n_mask, k_t, v = load_kv_tile(k_base, table, start, ctx_len, d, d_mask, stride_cb,
                                         stride_ckv, stride_co, BLOCK_N, BLOCK_SIZE, UPCAST)
        s = tl.dot(q, k_t, input_precision="ieee") * scale_log2
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_i, l_i, acc = online_softmax_update(s, v, m_i, l_i, acc)

    # An empty context (a padded batch slot) yields zeros rather than 0/0.
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    out_ptrs = out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attend query [S, Hq, D] (one token per sequence) to the first context_lens[s] cached
    tokens."""
    num_seqs, num_q_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    group = num_q_heads // num_kv_heads
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_seqs == 0:
        return out
    assert query.stride(-1) == 1 and kv_cache.stride(-1) == 1 and block_tables.stride(-1) == 1
    _decode_kernel[(num_seqs, num_kv_heads)](
        query, kv_cache, block_tables, context_lens, out,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        scale * math.log2(math.e),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=kv_cache.shape[2],
        BLOCK_G=max(_MIN_DOT_ROWS, triton.next_power_of_2(group)), BLOCK_N=_BLOCK_N,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), UPCAST=triton.knobs.runtime.interpret,
        num_warps=_NUM_WARPS,
    )
    return out
