"""The LoRA BGMV kernel against the torch reference: float64 runs compare at the same precision
(Triton's interpreter on CPU), and the reference itself against a per-token float64 product."""
import pytest
import torch

from baton.kernels.lora_bgmv import lora_bgmv
from baton.kernels.reference import lora_bgmv_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 3e-2}


def _case(tokens: int, k: int, n: int, slots: int, rank: int, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return dict(
        y=torch.randn(tokens, n + 5, generator=gen, dtype=torch.float64)[:, 2:n + 2],
        x=torch.randn(tokens, k, generator=gen, dtype=torch.float64),
        a=torch.randn(slots, rank, k, generator=gen, dtype=torch.float64),
        b=torch.randn(slots, n, rank, generator=gen, dtype=torch.float64),
        scales=torch.rand(slots, generator=gen, dtype=torch.float64) + 0.5,
        # -1 is a base-model token: its row must stay as it was.
        idx=torch.randint(-1, slots, (tokens,), generator=gen))


def _per_token(c: dict) -> torch.Tensor:
    want = c["y"].clone()
    for t, s in enumerate(c["idx"].tolist()):
        if s >= 0:
            want[t] += c["scales"][s] * (c["b"][s] @ (c["a"][s] @ c["x"][t]))
    return want


SHAPES = pytest.mark.parametrize("tokens,k,n,slots,rank", [
    (1, 64, 64, 1, 8), (9, 96, 160, 3, 16), (33, 130, 70, 4, 5), (5, 64, 32, 2, 1)])


@SHAPES
def test_reference_is_the_per_token_product(tokens: int, k: int, n: int, slots: int,
                                            rank: int) -> None:
    c = _case(tokens, k, n, slots, rank, seed=tokens + k)
    want = _per_token(c)
    lora_bgmv_ref(c["y"], c["x"], c["a"], c["b"], c["scales"], c["idx"])
    torch.testing.assert_close(c["y"], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=lambda d: str(d).removeprefix("torch."))
@SHAPES
def test_kernel_matches_reference(tokens: int, k: int, n: int, slots: int, rank: int,
                                  dtype: torch.dtype) -> None:
    c = _case(tokens, k, n, slots, rank, seed=tokens * 3 + n)
    want = _per_token(c)
    dev = {key: v.to(DEVICE) if key == "idx" else v.to(dtype).to(DEVICE) for key, v in c.items()}
    base = dev["y"].clone()
    lora_bgmv(dev["y"], dev["x"], dev["a"].contiguous(), dev["b"].contiguous(), dev["scales"],
              dev["idx"])
    tol = TOLERANCE[dtype] * (1 if dtype == torch.float64 else max(k, n) ** 0.5)
    torch.testing.assert_close(dev["y"].cpu().double(), want, rtol=tol, atol=tol)
    untouched = (c["idx"] < 0).to(DEVICE)
    assert torch.equal(dev["y"][untouched], base[untouched]), "base-model rows must not change"
