"""Pieces both paged attention kernels share: gathering one tile of K/V through the block table, and
the online softmax update (FlashAttention's running max, denominator and output)."""
import triton
import triton.language as tl


@triton.jit
def load_kv_tile(k_base, table, start, kv_end, d, d_mask, stride_cb, stride_ckv, stride_co,
                 BLOCK_N: tl.constexpr, BLOCK_SIZE: tl.constexpr, UPCAST: tl.constexpr):
    """Tokens [start, start + BLOCK_N) of one KV head: positions, their mask, K transposed [D, N]
    and V [N, D]. Every token's address goes through the block table, so the tile is independent of
    the cache block size."""
    n = start + tl.arange(0, BLOCK_N)
    n_mask = n < kv_end
    block = tl.load(table + n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    tok = block * stride_cb + (n % BLOCK_SIZE) * stride_co
    k_t = tl.load(k_base + tok[None, :] + d[:, None], mask=d_mask[:, None] & n_mask[None, :],
                  other=0.0)
    v = tl.load(k_base + stride_ckv + tok[:, None] + d[None, :],
                mask=n_mask[:, None] & d_mask[None, :], other=0.0)
    if UPCAST:  # the interpreter treats bf16 as raw uint16, so it must compute in fp32
        k_t = k_t.to(tl.float32)
        v = v.to(tl.float32)
    return n, n_mask, k_t, v


@triton.jit
def online_softmax_update(s, v, m_i, l_i, acc):
    """Folds scores s [M, N] (base-2, masked with -inf) and values v [N, D] into the running
    state."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return m_new, l_i, acc
