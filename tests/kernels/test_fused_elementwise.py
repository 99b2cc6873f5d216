"""The fused RMSNorm, SiLU-and-mul and rotary kernels against their torch references.

float64 runs compare the kernel with the reference at the same precision (interpreter mode on CPU,
compiled on a GPU); lower precisions are checked against the float64 reference within their
rounding.
"""
import pytest
import torch

from baton.kernels.reference import apply_rotary_ref, rms_norm_ref, silu_and_mul_ref
from baton.kernels.rms_norm import rms_norm
from baton.kernels.rotary import apply_rotary
from baton.kernels.silu_and_mul import silu_and_mul

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = pytest.mark.parametrize("dtype", list(TOLERANCE),
                                 ids=lambda d: str(d).removeprefix("torch."))


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got.cpu().double(), want.double(), rtol=tol, atol=tol)


@DTYPES
@pytest.mark.parametrize("rows,n", [(1, 64), (7, 96), (33, 256)])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rms_norm(rows: int, n: int, with_residual: bool, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(rows * 7 + n)
    x = torch.randn(rows, n, generator=gen, dtype=torch.float64)
    w = torch.randn(n, generator=gen, dtype=torch.float64)
    res = torch.randn(rows, n, generator=gen, dtype=torch.float64) if with_residual else None
    want_res = None if res is None else res.clone()
    want = rms_norm_ref(x, w, 1e-6, want_res)
    got_res = None if res is None else res.to(dtype).to(DEVICE).clone()
    got = rms_norm(x.to(dtype).to(DEVICE).clone(), w.to(dtype).to(DEVICE), 1e-6, got_res)
    _close(got, want, dtype)
    if res is not None:
        _close(got_res, want_res, dtype)
        assert not torch.equal(want_res, res), "the residual must be updated in place"


@DTYPES
@pytest.mark.parametrize("rows,n", [(1, 64), (5, 1000), (3, 2500)])
def test_silu_and_mul(rows: int, n: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(rows + n)
    # Gate and up as the two halves of one fused projection: strided rows.
    fused = torch.randn(rows, 2 * n, generator=gen, dtype=torch.float64) * 4
    gate, up = fused[:, :n], fused[:, n:]
    want = silu_and_mul_ref(gate, up)
    dev = fused.to(dtype).to(DEVICE)
    _close(silu_and_mul(dev[:, :n], dev[:, n:]), want, dtype)


@DTYPES
@pytest.mark.parametrize("tokens,q_heads,kv_heads,head_dim", [(1, 4, 4, 16), (9, 8, 2, 64),
                                                              (20, 6, 1, 128)])
def test_rotary(tokens: int, q_heads: int, kv_heads: int, head_dim: int,
                dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(tokens * 3 + head_dim)
    max_pos = 512
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    positions = torch.randint(0, max_pos, (tokens,), generator=gen)
    # q and k as views into one fused QKV output, as a fused projection would leave them.
    qkv = torch.randn(tokens, q_heads + 2 * kv_heads, head_dim, generator=gen, dtype=torch.float64)
    want_q, want_k = qkv[:, :q_heads].clone(), qkv[:, q_heads:q_heads + kv_heads].clone()
    apply_rotary_ref(want_q, want_k, cos, sin, positions)
    dev = qkv.to(dtype).to(DEVICE)
    q, k, v_before = dev[:, :q_heads], dev[:, q_heads:q_heads + kv_heads], dev[:, q_heads +
                                                                               kv_heads:].clone()
    apply_rotary(q, k, cos.to(DEVICE), sin.to(DEVICE), positions.to(DEVICE))
    _close(q, want_q, dtype)
    _close(k, want_k, dtype)
    assert torch.equal(dev[:, q_heads + kv_heads:], v_before), "v must be left alone"
