"""Punica's BGMV for LoRA in a mixed batch: each token's low-rank delta by the adapter slot of its
sequence, y[t] += scale[s] * B[s] @ (A[s] @ x[t]), in two launches (shrink to the rank, expand
into y's columns) over one stacked A and B, so a batch of many adapters and base-model tokens
(slot -1, skipped) costs one pass however it mixes, with the base GEMM shared."""
import torch
import triton
import triton.language as tl

from baton.kernels.accumulate import accumulator

_BLOCK_K = 64
_BLOCK_N = 64


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, idx_ptr, tmp_ptr, stride_x, stride_as, stride_ar, K,
                   R: tl.constexpr, RP: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(idx_ptr + t).to(tl.int64)
    if slot >= 0:
        r = tl.arange(0, RP)
        acc = tl.zeros([RP], dtype=ACC)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            xk = tl.load(x_ptr + t * stride_x + k, mask=k < K, other=0.0).to(ACC)
            a = tl.load(a_ptr + slot * stride_as + r[:, None] * stride_ar + k[None, :],
                        mask=(r[:, None] < R) & (k[None, :] < K), other=0.0).to(ACC)
            acc += tl.sum(a * xk[None, :], axis=1)
        tl.store(tmp_ptr + t * RP + r, acc)


@triton.jit
def _expand_kernel(y_ptr, b_ptr, idx_ptr, tmp_ptr, scale_ptr, stride_y, stride_bs, stride_bn, N,
                   R: tl.constexpr, RP: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(idx_ptr + t).to(tl.int64)
    if slot >= 0:
        r = tl.arange(0, RP)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        v = tl.load(tmp_ptr + t * RP + r)
        b = tl.load(b_ptr + slot * stride_bs + n[:, None] * stride_bn + r[None, :],
                    mask=(n[:, None] < N) & (r[None, :] < R), other=0.0).to(ACC)
        scale = tl.load(scale_ptr + slot).to(ACC)
        delta = tl.sum(b * v[None, :], axis=1) * scale
        y = tl.load(y_ptr + t * stride_y + n, mask=n < N, other=0.0).to(ACC)
        tl.store(y_ptr + t * stride_y + n, (y + delta).to(y_ptr.dtype.element_ty), mask=n < N)


def lora_bgmv(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
              scales: torch.Tensor, indices: torch.Tensor) -> None:
    """In place, as kernels/reference.py:lora_bgmv_ref: y [T, N] (strided rows allowed), x [T, K],
    A [S, R, K], B [S, N, R], scales [S], indices [T] (-1: no adapter)."""
    tokens, k = x.shape
    n, rank = y.shape[1], lora_a.shape[1]
    if tokens == 0:
        return
    assert x.stride(1) == 1 and y.stride(1) == 1
    assert lora_a.is_contiguous() and lora_b.is_contiguous()
    acc = accumulator(x.dtype)
    padded = triton.next_power_of_2(rank)
    tmp = torch.empty((tokens, padded), device=x.device,
                      dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    _shrink_kernel[(tokens,)](x, lora_a, indices, tmp, x.stride(0), lora_a.stride(0),
                              lora_a.stride(1), k, R=rank, RP=padded, BLOCK_K=_BLOCK_K, ACC=acc)
    _expand_kernel[(tokens, triton.cdiv(n, _BLOCK_N))](
        y, lora_b, indices, tmp, scales, y.stride(0), lora_b.stride(0), lora_b.stride(1), n,
        R=rank, RP=padded, BLOCK_N=_BLOCK_N, ACC=acc)
