"""SwiGLU's gate: silu(gate) * up in one pass, instead of torch's two kernels and an intermediate
tensor."""
import torch
import triton
import triton.language as tl

from baton.kernels.accumulate import accumulator

_BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(gate_ptr, up_ptr, out_ptr, stride_g, stride_u, stride_o, N: tl.constexpr,
                         BLOCK: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    g = tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0.0).to(ACC)
    u = tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0.0).to(ACC)
    out = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_o + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate, up [T, N] (rows may be strided, e.g. halves of a fused
    projection)."""
    rows, n = gate.shape
    out = torch.empty((rows, n), dtype=gate.dtype, device=gate.device)
    if rows == 0:
        return out
    assert gate.stride(-1) == 1 and up.stride(-1) == 1
    _silu_and_mul_kernel[(rows, triton.cdiv(n,
                                            _BLOCK))](gate, up, out, gate.stride(0), up.stride(0),
                                                      out.stride(0), N=n, BLOCK=_BLOCK,
                                                      ACC=accumulator(gate.dtype))
    return out
