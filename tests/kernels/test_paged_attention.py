import pytest
import torch
import torch.nn.functional as F

from baton.kernels.paged_decode_attention import decode_splits, paged_decode_attention
from baton.kernels.paged_prefill_attention import paged_prefill_attention
from baton.kernels.reference import (
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
    write_kv_cache_ref,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DTYPES = list(TOLERANCE)
GARBAGE = 1e3  # fills cache slots no sequence owns: any read of them swamps the result


def make_paged_cache(ctx_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int,
                     dtype: torch.dtype, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random cache whose sequences own shuffled, non-contiguous block ids; table padding points at
    a garbage block."""
    blocks_per_seq = [-(-n // block_size) for n in ctx_lens]
    num_blocks = sum(blocks_per_seq) + 2
    ids = torch.randperm(num_blocks, generator=gen)
    spare = ids[-1].item()
    table = torch.full((len(ctx_lens), max(blocks_per_seq) + 1), spare, dtype=torch.int32)
    cache = torch.full((num_blocks, 2, block_size, num_kv_heads, head_dim), GARBAGE)
    first = 0
    for s, (n, nb) in enumerate(zip(ctx_lens, blocks_per_seq)):
        table[s, :nb] = ids[first : first + nb].to(torch.int32)
        first += nb
        slots = table[s, :nb].long()[:, None] * block_size + torch.arange(block_size)
        kv = torch.randn(2, n, num_kv_heads, head_dim, generator=gen)
        write_kv_cache_ref(kv[0], kv[1], cache, slots.flatten()[:n])
    return cache.to(dtype), table


def make_query(
    num_tokens: int, num_q_heads: int, num_kv_heads: int, head_dim: int, gen: torch.Generator
) -> torch.Tensor:
    # A view into a fused QKV projection, so the kernels see a token stride larger than Hq * D.
    qkv = torch.randn(num_tokens, num_q_heads + 2 * num_kv_heads, head_dim, generator=gen)
    return qkv[:, :num_q_heads]


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Max absolute error over the largest reference magnitude (elementwise ratios blow up near
    zero)."""
    assert out.shape == ref.shape and torch.isfinite(out).all()
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


# (num_q_heads, num_kv_heads, head_dim, block_size)
LAYOUTS = [(4, 4, 16, 16), (4, 2, 32, 16), (6, 2, 64, 32), (3, 1, 32, 32), (8, 1, 16, 8)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda t: "q{}kv{}d{}b{}".format(*t))
def test_decode_matches_reference(layout: tuple[int, int, int, int], dtype: torch.dtype) -> None:
    num_q_heads, num_kv_heads, head_dim, block_size = layout
    gen = torch.Generator().manual_seed(sum(layout))
    # One token, exactly one block, partly filled last blocks, and several 32-token KV steps.
    ctx_lens = [1, block_size, block_size + 3, 70]
    cache, table = make_paged_cache(ctx_lens, num_kv_heads, head_dim, block_size, dtype, gen)
    query = make_query(len(ctx_lens), num_q_heads, num_kv_heads, head_dim, gen).to(dtype)
    lens = torch.tensor(ctx_lens, dtype=torch.int32)
    scale = head_dim**-0.5

    out = paged_decode_attention(query.to(DEVICE), cache.to(DEVICE), table.to(DEVICE),
                                 lens.to(DEVICE), scale)
    ref = paged_decode_attention_ref(query.double(), cache.double(), table, lens, scale)
    assert out.dtype == dtype
    assert rel_err(out.cpu(), ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("num_splits", [2, 3, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_split_decode_matches_reference(num_splits: int, dtype: torch.dtype) -> None:
    """Contexts cut into parts merged by a second kernel: splits that end mid-tile, that are empty
    (a 1-token context cut in 8), and an empty context."""
    num_q_heads, num_kv_heads, head_dim, block_size = 8, 2, 32, 16
    gen = torch.Generator().manual_seed(num_splits)
    ctx_lens = [1, block_size + 3, 70, 200, 0]
    cache, table = make_paged_cache(ctx_lens, num_kv_heads, head_dim, block_size, dtype, gen)
    query = make_query(len(ctx_lens), num_q_heads, num_kv_heads, head_dim, gen).to(dtype)
    lens = torch.tensor(ctx_lens, dtype=torch.int32)
    scale = head_dim**-0.5

    out = paged_decode_attention(query.to(DEVICE), cache.to(DEVICE), table.to(DEVICE),
                                 lens.to(DEVICE), scale, num_splits=num_splits).cpu()
    ref = paged_decode_attention_ref(query.double(), cache.double(), table, lens, scale)
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))
    assert rel_err(out, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("num_seqs,sm_count,splits", [
    (1, 132, 32),  # batch 1 of an 8B model on an H100: 256 programs instead of 8
    (32, 132, 3),
    (128, 132, 1),  # the batch fills the device alone
    (4, 0, 1),  # no SMs: the interpreter
])
def test_decode_splits_fill_the_device(num_seqs: int, sm_count: int, splits: int) -> None:
    assert decode_splits(num_seqs, 8, sm_count) == splits


def test_decode_empty_context_gives_zeros() -> None:
    gen = torch.Generator().manual_seed(0)
    cache, table = make_paged_cache([5, 1], 2, 16, 16, torch.float32, gen)
    query = make_query(2, 4, 2, 16, gen)
    lens = torch.tensor([5, 0], dtype=torch.int32)
    out = paged_decode_attention(query.to(DEVICE), cache.to(DEVICE), table.to(DEVICE),
                                 lens.to(DEVICE), 0.25).cpu()
    ref = paged_decode_attention_ref(query, cache, table, lens, 0.25)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.equal(ref[1], out[1])
    assert rel_err(out, ref.double()) < 1e-5


# Each chunk is (cached prefix length, chunk length); layouts as in LAYOUTS.
PREFILL_CASES = [
    pytest.param((4, 4, 16, 16), [(0, 1), (0, 20)], id="q4kv4d16b16"),
    pytest.param((4, 2, 32, 16), [(5, 7), (0, 33), (17, 1)], id="q4kv2d32b16"),
    pytest.param((6, 2, 64, 32), [(40, 9), (0, 70), (3, 64)], id="q6kv2d64b32-two-row-tiles"),
    pytest.param((3, 1, 32, 32), [(31, 2), (0, 1), (64, 20)], id="q3kv1d32b32"),
    pytest.param((8, 1, 16, 8), [(8, 8), (16, 16)], id="q8kv1d16b8"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("layout,chunks", PREFILL_CASES)
def test_prefill_matches_reference(
    layout: tuple[int, int, int, int], chunks: list[tuple[int, int]], dtype: torch.dtype
) -> None:
    num_q_heads, num_kv_heads, head_dim, block_size = layout
    gen = torch.Generator().manual_seed(sum(layout) + len(chunks))
    ctx_lens = [prefix + q for prefix, q in chunks]
    cache, table = make_paged_cache(ctx_lens, num_kv_heads, head_dim, block_size, dtype, gen)
    starts = torch.tensor([0] + [q for _, q in chunks],
                          dtype=torch.int32).cumsum(0, dtype=torch.int32)
    query = make_query(int(starts[-1]), num_q_heads, num_kv_heads, head_dim, gen).to(dtype)
    lens = torch.tensor(ctx_lens, dtype=torch.int32)
    scale = head_dim**-0.5

    args = (table, starts, lens)
    out = paged_prefill_attention(query.to(DEVICE), cache.to(DEVICE), *(a.to(DEVICE) for a in args),
                                  scale)
    ref = paged_prefill_attention_ref(query.double(), cache.double(), *args, scale)
    assert out.dtype == dtype
    assert rel_err(out.cpu(), ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("num_q_heads,num_kv_heads", [(4, 4), (6, 2), (3, 1)])
def test_references_match_sdpa(num_q_heads: int, num_kv_heads: int) -> None:
    """Check the references themselves against torch SDPA on plain contiguous K/V."""
    head_dim, block_size, scale = 32, 16, 0.3
    chunks = [(0, 5), (13, 7), (20, 1), (0, 1)]
    gen = torch.Generator().manual_seed(num_q_heads)
    ctx_lens = [prefix + q for prefix, q in chunks]
    cache, table = make_paged_cache(ctx_lens, num_kv_heads, head_dim, block_size, torch.float64,
                                    gen)
    starts = [0]
    for _, q in chunks:
        starts.append(starts[-1] + q)
    query = torch.randn(starts[-1], num_q_heads, head_dim, generator=gen, dtype=torch.float64)
    lens = torch.tensor(ctx_lens, dtype=torch.int32)
    prefill = paged_prefill_attention_ref(query, cache, table,
                                          torch.tensor(starts, dtype=torch.int32), lens, scale)
    last_rows = torch.tensor(starts[1:]) - 1
    decode = paged_decode_attention_ref(query[last_rows], cache, table, lens, scale)

    for s, n in enumerate(ctx_lens):
        slots = (table[s].long()[:, None] * block_size + torch.arange(block_size)).flatten()[:n]
        k = cache[:, 0].flatten(0, 1)[slots].transpose(0, 1)  # [Hkv, L, D]
        v = cache[:, 1].flatten(0, 1)[slots].transpose(0, 1)
        q = query[starts[s] : starts[s + 1]].transpose(0, 1)  # [Hq, q, D]
        causal = torch.arange(n)[None, :] <= torch.arange(n - q.shape[1], n)[:, None]
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, scale=scale,
                                                  enable_gqa=True)
        torch.testing.assert_close(prefill[starts[s]:starts[s + 1]], expected.transpose(0, 1),
                                   rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(decode[s], expected[:, -1], rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled kernels need a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_compiled_long_contexts(dtype: torch.dtype) -> None:
    """Shapes too slow for the interpreter: head_dim 128, thousands of tokens, many query tiles."""
    num_q_heads, num_kv_heads, head_dim, block_size = 32, 8, 128, 16
    chunks = [(0, 1000), (1500, 300), (4000, 1), (0, 64)]
    gen = torch.Generator().manual_seed(7)
    ctx_lens = [prefix + q for prefix, q in chunks]
    cache, table = make_paged_cache(ctx_lens, num_kv_heads, head_dim, block_size, dtype, gen)
    starts = torch.tensor([0] + [q for _, q in chunks],
                          dtype=torch.int32).cumsum(0, dtype=torch.int32)
    query = make_query(int(starts[-1]), num_q_heads, num_kv_heads, head_dim, gen).to(dtype)
    lens = torch.tensor(ctx_lens, dtype=torch.int32)
    cuda = [t.cuda() for t in (query, cache, table, starts, lens)]

    prefill = paged_prefill_attention(*cuda, 0.1).cpu()
    ref = paged_prefill_attention_ref(query.double(), cache.double(), table, starts, lens, 0.1)
    assert rel_err(prefill, ref) < TOLERANCE[dtype]
    last_rows = starts[1:].long() - 1
    for splits in (1, None):  # one program per sequence and head; split to fill the device
        decode = paged_decode_attention(cuda[0][last_rows.cuda()], cuda[1], cuda[2], cuda[4], 0.1,
                                        num_splits=splits).cpu()
        assert rel_err(decode, ref[last_rows]) < TOLERANCE[dtype]
