"""Rotary position embedding (the rotate-half form Llama uses) on q and k in place, in one
launch."""
import torch
import triton
import triton.language as tl

from baton.kernels.accumulate import accumulator


@triton.jit
def _rotate(ptr, stride_t, stride_h, tok, cos, sin, NUM_HEADS: tl.constexpr, HALF: tl.constexpr,
            BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, ACC: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < NUM_HEADS) & (d < HALF)
    lo_ptr = ptr + tok * stride_t + h * stride_h + d
    x1 = tl.load(lo_ptr, mask=mask, other=0.0).to(ACC)
    x2 = tl.load(lo_ptr + HALF, mask=mask, other=0.0).to(ACC)
    tl.store(lo_ptr, (x1 * cos - x2 * sin).to(ptr.dtype.element_ty), mask=mask)
    tl.store(lo_ptr + HALF, (x2 * cos + x1 * sin).to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, pos_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_c,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr, ACC: tl.constexpr,
):
    # One program per token: its cos/sin row is read once and shared by all q and k heads.
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)[None, :]
    # The tables repeat their first half (transformers' cat(freqs, freqs)), so half a row is all
    # there is.
    cos = tl.load(cos_ptr + pos * stride_c + d, mask=d < HALF, other=0.0).to(ACC)
    sin = tl.load(sin_ptr + pos * stride_c + d, mask=d < HALF, other=0.0).to(ACC)
    _rotate(q_ptr, stride_qt, stride_qh, tok, cos, sin, NUM_Q_HEADS, HALF, BLOCK_QH, BLOCK_HALF,
            ACC)
    _rotate(k_ptr, stride_kt, stride_kh, tok, cos, sin, NUM_K_HEADS, HALF, BLOCK_KH, BLOCK_HALF,
            ACC)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor) -> None:
    """Rotates q [T, Hq, D] and k [T, Hkv, D] in place by the rows `positions` [T] of cos/sin [P,
    D]."""
    tokens, q_heads, head_dim = q.shape
    if tokens == 0:
        return
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos.stride(
        -1) == 1 and cos.stride() == sin.stride()
    half = head_dim // 2
    _rotary_kernel[(tokens, )](
        q,
        k,
        cos,
        sin,
        positions,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        cos.stride(0),
        NUM_Q_HEADS=q_heads,
        NUM_K_HEADS=k.shape[1],
        HALF=half,
        BLOCK_QH=triton.next_power_of_2(q_heads),
        BLOCK_KH=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half),
        ACC=accumulator(q.dtype),
    )
