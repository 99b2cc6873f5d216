"""Attention over the paged KV cache for one step's packed batch.

Tokens are packed prefill chunks first, then decode tokens (one per sequence). The torch path serves CPUs with
PyTorch's SDPA; the Triton path calls baton.kernels. Both write this step's K/V into the cache first, so a
chunk attends to its cached prefix and to itself the same way.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillSpan:
    query_start: int
    query_len: int
    context_len: int  # cached prefix plus this chunk
    block_ids: list[int]


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: where each token's K/V goes
    num_prefill_tokens: int
    prefill_spans: list[PrefillSpan]
    prefill_block_tables: torch.Tensor  # [P, max_blocks] int32
    prefill_query_start_loc: torch.Tensor  # [P + 1] int32
    prefill_context_lens: torch.Tensor  # [P] int32
    decode_block_tables: torch.Tensor  # [D, max_blocks] int32
    decode_context_lens: torch.Tensor  # [D] int32


class Attention:
    """Shared by all layers; holds the whole cache, [layers, blocks, 2 (K, V), block_size, kv_heads, head_dim]."""

    def __init__(self, scale: float, backend: str, block_size: int) -> None:
        self.kv_cache = torch.empty(0)  # allocated by the model runner once the weights are in place
        self.block_size = block_size
        self.scale = scale
        self.backend = backend
        if backend == "triton":
            from baton.kernels import kv_cache_write, paged_decode_attention, paged_prefill_attention
            self._write = kv_cache_write.write_kv_cache
            self._decode = paged_decode_attention.paged_decode_attention
            self._prefill = paged_prefill_attention.paged_prefill_attention

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 meta: AttentionMetadata) -> torch.Tensor:
        cache = self.kv_cache[layer]
        if self.backend == "triton":
            return self._triton(cache, q, k, v, meta)
        return self._torch(cache, q, k, v, meta)

    def _triton(self, cache: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        self._write(k, v, cache, meta.slot_mapping)
        p = meta.num_prefill_tokens
        parts = []
        if p:
            parts.append(self._prefill(q[:p], cache, meta.prefill_block_tables, meta.prefill_query_start_loc,
                                       meta.prefill_context_lens, self.scale))
        if q.shape[0] > p:
            parts.append(self._decode(q[p:], cache, meta.decode_block_tables, meta.decode_context_lens, self.scale))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _torch(self, cache: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        blocks, offsets = meta.slot_mapping // self.block_size, meta.slot_mapping % self.block_size
        cache[blocks, 0, offsets] = k
        cache[blocks, 1, offsets] = v
        out = torch.empty_like(q)
        for span in meta.prefill_spans:
            rows = slice(span.query_start, span.query_start + span.query_len)
            out[rows] = self._prefill_torch(cache, q[rows], k[rows], v[rows], span)
        p = meta.num_prefill_tokens
        if q.shape[0] > p:
            out[p:] = self._decode_torch(cache, q[p:], meta.decode_block_tables, meta.decode_context_lens)
        return out

    def _prefill_torch(self, cache: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       span: PrefillSpan) -> torch.Tensor:
        qh = q.transpose(0, 1).unsqueeze(0)
        if span.context_len == span.query_len:
            # No cached prefix: attend to this chunk's own K/V, exactly as a plain causal forward would.
            kh, vh = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=self.scale, enable_gqa=True)
            return out.squeeze(0).transpose(0, 1)
        kv = cache[span.block_ids].transpose(0, 1).flatten(1, 2)[:, :span.context_len]  # [2, ctx, H, D]
        kh, vh = kv[0].transpose(0, 1).unsqueeze(0), kv[1].transpose(0, 1).unsqueeze(0)
        first = span.context_len - span.query_len
        q_pos = torch.arange(first, span.context_len).unsqueeze(1)
        mask = torch.arange(span.context_len).unsqueeze(0) <= q_pos
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=self.scale, enable_gqa=True)
        return out.squeeze(0).transpose(0, 1)

    def _decode_torch(self, cache: torch.Tensor, q: torch.Tensor, block_tables: torch.Tensor,
                      context_lens: torch.Tensor) -> torch.Tensor:
        d, max_blocks = block_tables.shape
        kv = cache[block_tables.long()]  # [D, max_blocks, 2, B, H, Dh]
        kv = kv.transpose(1, 2).flatten(2, 3)  # [D, 2, S, H, Dh]
        kh, vh = kv[:, 0].transpose(1, 2), kv[:, 1].transpose(1, 2)  # [D, H, S, Dh]
        mask = torch.arange(kh.shape[2]).unsqueeze(0) < context_lens.unsqueeze(1)
        out = F.scaled_dot_product_attention(q.unsqueeze(2), kh, vh, attn_mask=mask[:, None, None, :],
                                             scale=self.scale, enable_gqa=True)
        return out.squeeze(2)
