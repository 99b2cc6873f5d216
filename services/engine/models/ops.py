"""The model's elementwise operations: fused Triton kernels on CUDA, the plain torch forms
elsewhere.

The torch forms keep transformers' order of operations, so CPU outputs match it exactly; the kernels
compute in float32 and round once, and are checked against the same references in tests/kernels.
"""
from __future__ import annotations

import torch


def _fused(x: torch.Tensor) -> bool:
    return x.is_cuda


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (RMSNorm(x + residual), x + residual); without residual, (RMSNorm(x), x)."""
    if _fused(x):
        from baton.kernels.rms_norm import rms_norm as kernel
        shape = x.shape
        out = kernel(x.reshape(-1, shape[-1]), weight, eps,
                     None if residual is None else residual.view(-1, shape[-1]))
        return out.view(shape), x if residual is None else residual
    if residual is not None:
        x = residual + x
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype), x


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if _fused(gate):
        from baton.kernels.silu_and_mul import silu_and_mul as kernel
        return kernel(gate, up)
    return torch.nn.functional.silu(gate) * up


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D], k: [T, Hkv, D] rotated by the rows `positions` of the cos/sin tables [P,
    D]."""
    if _fused(q):
        from baton.kernels.rotary import apply_rotary
        apply_rotary(q, k, cos, sin, positions)  # in place: q and k are fresh projection outputs
        return q, k
    # In the activations' dtype, as transformers does.
    c = cos[positions].to(q.dtype).unsqueeze(1)
    s = sin[positions].to(q.dtype).unsqueeze(1)
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
