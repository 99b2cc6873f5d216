"""The Triton kernels over a head-major (HND) cache, the strided view of [blocks, 2, kv_heads,
block_size, head_dim] storage the engine hands them with --kv-cache-layout HND: the write lands
where the reference writes, and both attention kernels match their float64 references."""
import pytest
import torch

from baton.kernels.kv_cache_write import write_kv_cache
from baton.kernels.paged_decode_attention import paged_decode_attention
from baton.kernels.paged_prefill_attention import paged_prefill_attention
from baton.kernels.reference import (paged_decode_attention_ref, paged_prefill_attention_ref,
                                     write_kv_cache_ref)
from tests.kernels.test_paged_attention import (TOLERANCE, make_paged_cache, make_query,
                                                rel_err)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]


def head_major(cache: torch.Tensor) -> torch.Tensor:
    """The same values as `cache` [blocks, 2, block_size, heads, dim], stored head-major."""
    hnd = cache.transpose(2, 3).contiguous().to(DEVICE).transpose(2, 3)
    assert not hnd.is_contiguous() and hnd.transpose(2, 3).is_contiguous()
    return hnd


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_write_into_hnd_cache(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    num_tokens, heads, dim, block_size = 21, 2, 32, 16
    slots = torch.randperm(4 * block_size, generator=gen)[:num_tokens]
    slots[torch.rand(num_tokens, generator=gen) < 0.2] = -1
    qkv = torch.randn(num_tokens, 3, heads, dim, generator=gen).to(dtype)
    cache = torch.randn(4, 2, block_size, heads, dim, generator=gen).to(dtype)
    got, expected = head_major(cache), cache.clone()
    write_kv_cache(qkv[:, 1].to(DEVICE), qkv[:, 2].to(DEVICE), got, slots.to(DEVICE))
    write_kv_cache_ref(qkv[:, 1], qkv[:, 2], expected, slots)
    assert torch.equal(got.cpu(), expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_over_hnd_cache(dtype: torch.dtype, num_splits: int) -> None:
    num_q_heads, num_kv_heads, head_dim, block_size = 8, 2, 32, 16
    gen = torch.Generator().manual_seed(num_splits)
    ctx_lens = [1, block_size + 3, 70]
    cache, table = make_paged_cache(ctx_lens, num_kv_heads, head_dim, block_size, dtype, gen)
    query = make_query(len(ctx_lens), num_q_heads, num_kv_heads, head_dim, gen).to(dtype)
    lens = torch.tensor(ctx_lens, dtype=torch.int32)
    out = paged_decode_attention(query.to(DEVICE), head_major(cache), table.to(DEVICE),
                                 lens.to(DEVICE), head_dim**-0.5, num_splits=num_splits)
    ref = paged_decode_attention_ref(query.double(), cache.double(), table, lens, head_dim**-0.5)
    assert rel_err(out.cpu(), ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_prefill_over_hnd_cache(dtype: torch.dtype) -> None:
    num_q_heads, num_kv_heads, head_dim, block_size = 4, 2, 32, 16
    gen = torch.Generator().manual_seed(9)
    chunks = [(5, 7), (0, 33), (17, 1)]  # (cached prefix, chunk length)
    ctx_lens = [prefix + q for prefix, q in chunks]
    cache, table = make_paged_cache(ctx_lens, num_kv_heads, head_dim, block_size, dtype, gen)
    starts = torch.tensor([0] + [q for _, q in chunks],
                          dtype=torch.int32).cumsum(0, dtype=torch.int32)
    query = make_query(int(starts[-1]), num_q_heads, num_kv_heads, head_dim, gen).to(dtype)
    args = (table, starts, torch.tensor(ctx_lens, dtype=torch.int32))
    out = paged_prefill_attention(query.to(DEVICE), head_major(cache),
                                  *(a.to(DEVICE) for a in args), head_dim**-0.5)
    ref = paged_prefill_attention_ref(query.double(), cache.double(), *args, head_dim**-0.5)
    assert rel_err(out.cpu(), ref) < TOLERANCE[dtype]
