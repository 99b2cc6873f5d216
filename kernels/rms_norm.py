"""RMSNorm, optionally fused with the residual add that precedes it in every decoder layer."""
import torch
import triton
import triton.language as tl

from baton.kernels.accumulate import accumulator


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, stride_x, stride_r, stride_o, eps,
    N: tl.constexpr, BLOCK_N: tl.constexpr, HAS_RESIDUAL: tl.constexpr, ACC: tl.constexpr,
):
    # One program per row: the whole row is one read, so x + residual, the sum of squares and the
    # scaling cost one pass over memory instead of the four small kernels torch launches.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        # Rounded to the activations' dtype, as the unfused add would leave it.
        x = (x.to(ACC) + r.to(ACC)).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + row * stride_r + cols, x, mask=mask)
    x32 = x.to(ACC)
    rstd = 1.0 / tl.sqrt(tl.sum(x32 * x32, axis=0) / N + eps)
    normed = (x32 * rstd).to(out_ptr.dtype.element_ty).to(ACC)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC)
    tl.store(out_ptr + row * stride_o + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of x [T, N]. With residual [T, N]: residual += x in place first, and the sum is
    normalized."""
    rows, n = x.shape
    out = torch.empty_like(x)
    if rows == 0:
        return out
    assert x.stride(-1) == 1 and weight.is_contiguous() and (residual is None or
                                                             residual.stride(-1) == 1)
    res = x if residual is None else residual
    _rms_norm_kernel[(rows, )](
        x,
        res,
        weight,
        out,
        x.stride(0),
        res.stride(0),
        out.stride(0),
        eps,
        N=n,
        BLOCK_N=triton.next_power_of_2(n),
        HAS_RESIDUAL=residual is not None,
        ACC=accumulator(x.dtype),
    )
    return out
