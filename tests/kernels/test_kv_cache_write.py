import pytest
import torch

from baton.kernels.kv_cache_write import write_kv_cache
from baton.kernels.reference import write_kv_cache_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(
    "num_tokens,num_kv_heads,head_dim,block_size",
    [(1, 1, 16, 16), (21, 2, 32, 16), (40, 3, 64, 32), (9, 8, 128, 8)],
)
def test_write_kv_cache(num_tokens: int, num_kv_heads: int, head_dim: int, block_size: int,
                        dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(num_tokens * 131 + head_dim)
    num_blocks = num_tokens // block_size + 3
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[torch.rand(num_tokens, generator=gen) < 0.2] = -1  # padding tokens
    # K and V as views into a fused QKV projection, as the engine produces them.
    qkv = torch.randn(num_tokens, 3, num_kv_heads, head_dim, generator=gen).to(dtype)
    key, value = qkv[:, 1], qkv[:, 2]
    cache = torch.randn(num_blocks, 2, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    got, expected = cache.clone().to(DEVICE), cache.clone()

    write_kv_cache(key.to(DEVICE), value.to(DEVICE), got, slots.to(DEVICE))
    write_kv_cache_ref(key, value, expected, slots)

    assert torch.equal(got.cpu(), expected)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            block, offset = divmod(slot, block_size)
            assert torch.equal(expected[block, 0, offset], key[t])
            assert torch.equal(expected[block, 1, offset], value[t])
    untouched = torch.ones(num_blocks, block_size, dtype=torch.bool)
    untouched.view(-1)[slots[slots >= 0]] = False
    assert torch.equal(expected.transpose(1, 2)[untouched], cache.transpose(1, 2)[untouched])
