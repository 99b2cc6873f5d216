"""Causal prefill attention for variable-length chunks packed flat, over the paged KV cache."""
import math

import torch
import triton
import triton.language as tl

from baton.kernels.paged_kv_tile import load_kv_tile, online_softmax_update

_BLOCK_M = 64  # query rows per program
# KV tokens per loop step, gathered through the block table. fp32 operands take the FMA
# (not tensor-core) dot path, which needs the smaller step to stay spill-free at head_dim
# 128 on sm_90; both settings use 8 warps for the same reason.
_BLOCK_N = {torch.float32: 32, torch.float16: 64, torch.bfloat16: 64}
_NUM_WARPS = 8


@triton.jit
def _find_seq(query_start_loc_ptr, num_seqs, tile, BLOCK_M: tl.constexpr):
    # Sequence s owns tiles from query_start_loc[s] // BLOCK_M + s on: strictly increasing
    # and never overlapping, so the grid needs no host-side max chunk length (no sync).
    lo: tl.int32 = 0
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_M + mid <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _prefill_kernel(
    q_ptr, cache_ptr, block_tables_ptr, query_start_loc_ptr, context_lens_ptr, out_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_ckv, stride_co, stride_ch,
    scale_log2, num_seqs,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, UPCAST: tl.constexpr,
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    seq = _find_seq(query_start_loc_ptr, num_seqs, tile, BLOCK_M)
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    local_tile = tile - (q_start // BLOCK_M + seq)
    if local_tile * BLOCK_M >= q_len:  # spare tile of the over-sized grid
        return
    ctx_len = tl.load(context_lens_ptr + seq)
    prefix = ctx_len - q_len

    m = local_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < HEAD_DIM
    q_mask = (m < q_len)[:, None] & d_mask[None, :]
    rows = (q_start + m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head * stride_qh + d[None, :], mask=q_mask,
                other=0.0)
    if UPCAST:  # the interpreter treats bf16 as raw uint16, so it must compute in fp32
        q = q.to(tl.float32)
    pos = prefix + m  # absolute position of each query row

    k_base = cache_ptr + (head // GROUP) * stride_ch
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Keys past this tile's last row are causally invisible to every row in it.
    kv_end = prefix + tl.minimum(q_len, (local_tile + 1) * BLOCK_M)
    # Key 0 is visible to every row (padding rows included), so m_i is finite after the
    # first step and later fully masked steps contribute exp2(-inf) = 0, never NaN.
    for start in range(0, kv_end, BLOCK_N):
        n, n_mask, k_t, v = load_kv_tile(k_base, table, start, kv_end, d, d_mask, stride_cb,
                                         stride_ckv, stride_co, BLOCK_N, BLOCK_SIZE, UPCAST)
        s = tl.dot(q, k_t, input_precision="ieee") * scale_log2
        s = tl.where(n_mask[None, :] & (n[None, :] <= pos[:, None]), s, float("-inf"))
        m_i, l_i, acc = online_softmax_update(s, v, m_i, l_i, acc)

    out = acc / l_i[:, None]
    out_ptrs = out_ptr + rows[:, None] * stride_ot + head * stride_oh + d[None, :]
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_prefill_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention for query [T, Hq, D]: sequence s owns rows query_start_loc[s]:[s+1],
    which are the last tokens of its first context_lens[s] cached tokens."""
    num_tokens, num_q_heads, head_dim = query.shape
    num_seqs = context_lens.shape[0]
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_tokens == 0:
        return out
    assert query.stride(-1) == 1 and kv_cache.stride(-1) == 1 and block_tables.stride(-1) == 1
    # Upper bound on the tiles all chunks need (see _find_seq); spare programs exit at once.
    grid = (num_tokens // _BLOCK_M + num_seqs, num_q_heads)
    _prefill_kernel[grid](
        query, kv_cache, block_tables, query_start_loc, context_lens, out,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        scale * math.log2(math.e), num_seqs,
        GROUP=num_q_heads // kv_cache.shape[3], HEAD_DIM=head_dim, BLOCK_SIZE=kv_cache.shape[2],
        BLOCK_M=_BLOCK_M, BLOCK_N=_BLOCK_N[query.dtype],
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), UPCAST=triton.knobs.runtime.interpret,
        num_warps=_NUM_WARPS,
    )
    return out
