"""Plain torch versions of the kernels: the tests' ground truth and the engine's CPU path.

They compute in at least fp32 (and in fp64 for fp64 inputs) and return the query dtype.
"""
import torch


def write_kv_cache_ref(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write key/value [T, Hkv, D] into kv_cache [N, 2, B, Hkv, D] at slot_mapping [T]; slot -1
    skips a token."""
    block_size = kv_cache.shape[2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    blocks, offsets = slots // block_size, slots % block_size
    kv_cache[blocks, 0, offsets] = key[keep].to(kv_cache.dtype)
    kv_cache[blocks, 1, offsets] = value[keep].to(kv_cache.dtype)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _gather(kv_cache: torch.Tensor, blocks: torch.Tensor,
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V for block ids [..., nb] as [..., nb * B, Hkv, D]."""
    kv = kv_cache[blocks.long()].to(dtype)  # [..., nb, 2, B, Hkv, D]
    k, v = kv.select(-4, 0), kv.select(-4, 1)
    return k.flatten(-4, -3), v.flatten(-4, -3)


def paged_decode_attention_ref(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attend query [S, Hq, D] (one token per sequence) to the first context_lens[s] cached
    tokens."""
    num_seqs, num_q_heads, head_dim = query.shape
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    dtype = _compute_dtype(query.dtype)
    max_len = int(context_lens.max()) if num_seqs else 0
    num_blocks = -(-max_len // block_size)
    # Table entries past a sequence's own blocks may be stale or padding: point them at block 0.
    cols = torch.arange(num_blocks, device=query.device)
    used = cols[None, :] * block_size < context_lens[:, None]
    blocks = torch.where(used, block_tables[:, :num_blocks], 0)
    k, v = _gather(kv_cache, blocks, dtype)  # [S, L, Hkv, D]
    q = query.to(dtype).reshape(num_seqs, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    scores = torch.einsum("skgd,slkd->skgl", q, k) * scale
    visible = torch.arange(k.shape[1], device=query.device)[None, :] < context_lens[:, None]
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    # An empty context (a padded batch slot) yields zeros rather than NaN, as in the kernel.
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = torch.einsum("skgl,slkd->skgd", probs, v)
    return out.reshape(query.shape).to(query.dtype)


def paged_prefill_attention_ref(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal attention for query [T, Hq, D]: sequence s owns rows query_start_loc[s]:[s+1],
    which are the last tokens of its first context_lens[s] cached tokens."""
    num_tokens, num_q_heads, head_dim = query.shape
    block_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    group = num_q_heads // num_kv_heads
    dtype = _compute_dtype(query.dtype)
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    starts, lens = query_start_loc.tolist(), context_lens.tolist()
    for s, ctx_len in enumerate(lens):
        lo, hi = starts[s], starts[s + 1]
        if hi == lo:
            continue
        k, v = _gather(kv_cache, block_tables[s, : -(-ctx_len // block_size)], dtype)
        k, v = k[:ctx_len], v[:ctx_len]  # [L, Hkv, D]
        q = query[lo:hi].to(dtype).reshape(hi - lo, num_kv_heads, group, head_dim)
        scores = torch.einsum("qkgd,lkd->kgql", q, k) * scale
        pos = torch.arange(ctx_len - (hi - lo), ctx_len, device=query.device)
        causal = torch.arange(ctx_len, device=query.device)[None, :] <= pos[:, None]
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        out[lo:hi] = torch.einsum("kgql,lkd->qkgd", probs, v).reshape(hi - lo, num_q_heads,
                                                                      head_dim).to(query.dtype)
    return out


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm of x [T, N] in at least fp32. With residual: residual += x in place first, and the
    sum is normalized."""
    if residual is not None:
        residual.copy_(residual + x)
        x = residual
    dtype = _compute_dtype(x.dtype)
    x32 = x.to(dtype)
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.to(dtype)).to(x.dtype)


def silu_and_mul_ref(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    dtype = _compute_dtype(gate.dtype)
    return (torch.nn.functional.silu(gate.to(dtype)) * up.to(dtype)).to(gate.dtype)


def apply_rotary_ref(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     positions: torch.Tensor) -> None:
    """Rotates q [T, Hq, D] and k [T, Hkv, D] in place by the rows `positions` [T] of cos/sin [P,
    D]."""
    for x in (q, k):
        dtype = _compute_dtype(x.dtype)
        c = cos[positions.long()].to(dtype).unsqueeze(1)
        s = sin[positions.long()].to(dtype).unsqueeze(1)
        x32 = x.to(dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x32[..., half:], x32[..., :half]), dim=-1)
        x.copy_((x32 * c + rotated * s).to(x.dtype))



def lora_bgmv_ref(y: torch.Tensor, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                  scales: torch.Tensor, indices: torch.Tensor) -> None:
    """y[t] += scales[s] * B[s] @ (A[s] @ x[t]) with s = indices[t], for every row t whose index is
    not -1 (a base-model token): Punica's BGMV, in place. y [T, N] (rows may be strided),
    x [T, K], A [S, R, K], B [S, N, R], scales [S].

    As two GEMMs over the slots the batch uses rather than a copy of A and B per token (which on a
    CPU would move more bytes than the base weights): every row is shrunk by every used adapter's
    A, the blocks of other adapters are zeroed, and one GEMM with the used Bs side by side expands
    each row by its own. The zeros add nothing, so each row's sums are its own adapter's."""
    rows = (indices >= 0).nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    dtype = _compute_dtype(x.dtype)
    used, local = torch.unique(indices[rows], return_inverse=True)
    u, rank, k = len(used), lora_a.shape[1], lora_a.shape[2]
    shrunk = x[rows].to(dtype) @ lora_a[used].to(dtype).reshape(u * rank, k).T
    own = torch.nn.functional.one_hot(local, u).to(dtype)  # [n, u]
    shrunk = (shrunk.view(-1, u, rank) * own[:, :, None]).view(-1, u * rank)
    expand = lora_b[used].to(dtype).permute(1, 0, 2).reshape(lora_b.shape[1], u * rank)
    delta = (shrunk @ expand.T) * scales[used].to(dtype)[local][:, None]
    y.index_add_(0, rows, delta.to(y.dtype))
