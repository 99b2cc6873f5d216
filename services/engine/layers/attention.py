"""Attention over the paged KV cache for one step's packed batch.

Tokens are packed prefill chunks first, then decode tokens (one per sequence). The torch path serves
CPUs with PyTorch's SDPA; the Triton path calls baton.kernels. Both write this step's K/V into the
cache first, so a chunk attends to its cached prefix and to itself the same way.
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
    torch_plan: "TorchPlan | None" = None  # filled for the torch path only


class Attention:
    """Shared by all layers; holds the whole cache, [layers, blocks, 2 (K, V), block_size, kv_heads,
    head_dim], token- or head-major in memory (kv/layout.py)."""

    def __init__(self, scale: float, backend: str, block_size: int) -> None:
        # allocated by the model runner once the weights are in place
        self.kv_cache = torch.empty(0)
        self.block_size = block_size
        self.scale = scale
        self.backend = backend
        if backend == "triton":
            from baton.kernels import (kv_cache_write, paged_decode_attention,
                                       paged_prefill_attention)
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
            parts.append(
                self._prefill(q[:p], cache, meta.prefill_block_tables, meta.prefill_query_start_loc,
                              meta.prefill_context_lens, self.scale))
        if q.shape[0] > p:
            parts.append(
                self._decode(q[p:], cache, meta.decode_block_tables, meta.decode_context_lens,
                             self.scale))
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _torch(self, cache: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               meta: AttentionMetadata) -> torch.Tensor:
        plan = meta.torch_plan
        self._write_torch(cache, plan.k_rows, k, v)
        out = torch.empty_like(q)
        for span in meta.prefill_spans:
            sl = slice(span.query_start, span.query_start + span.query_len)
            out[sl] = self._prefill_torch(cache, q[sl], k[sl], v[sl], span)
        p = meta.num_prefill_tokens
        for group in plan.decode_groups:
            out[p + group.rows] = self._decode_group(cache, q[p + group.rows], group)
        return out

    def _write_torch(self, cache: torch.Tensor, k_rows: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor) -> None:
        if cache.is_contiguous():
            rows = cache.view(-1, *cache.shape[-2:])  # [blocks * 2 * block_size, H, D]
            rows.index_copy_(0, k_rows, k)
            rows.index_copy_(0, k_rows + self.block_size, v)
            return
        # A head-major (HND) cache is a strided view whose rows do not flatten: index it instead.
        blocks, offsets = k_rows // (2 * self.block_size), k_rows % (2 * self.block_size)
        cache[blocks, 0, offsets] = k
        cache[blocks, 1, offsets] = v

    def _prefill_torch(self, cache: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       span: PrefillSpan) -> torch.Tensor:
        qh = q.transpose(0, 1).unsqueeze(0)
        if span.context_len == span.query_len:
            # No cached prefix: attend to this chunk's own K/V, exactly as a plain causal forward
            # would.
            kh, vh = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
            out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=self.scale,
                                                 enable_gqa=True)
            return out.squeeze(0).transpose(0, 1)
        blocks = torch.tensor(span.block_ids, dtype=torch.int64)
        kh = cache[:,
                   0].index_select(0,
                                   blocks).flatten(0,
                                                   1)[:span.context_len].transpose(0,
                                                                                   1).unsqueeze(0)
        vh = cache[:,
                   1].index_select(0,
                                   blocks).flatten(0,
                                                   1)[:span.context_len].transpose(0,
                                                                                   1).unsqueeze(0)
        first = span.context_len - span.query_len
        q_pos = torch.arange(first, span.context_len).unsqueeze(1)
        mask = torch.arange(span.context_len).unsqueeze(0) <= q_pos
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=self.scale,
                                             enable_gqa=True)
        return out.squeeze(0).transpose(0, 1)

    def _decode_group(self, cache: torch.Tensor, q: torch.Tensor,
                      group: "DecodeGroup") -> torch.Tensor:
        """One gather per group of similar-length sequences, sized to stay in cache for the SDPA
        that follows."""
        n = group.rows.shape[0]
        kh = cache[:, 0].index_select(0, group.blocks).view(n, -1,
                                                            *cache.shape[-2:]).transpose(1, 2)
        vh = cache[:, 1].index_select(0, group.blocks).view(n, -1,
                                                            *cache.shape[-2:]).transpose(1, 2)
        out = F.scaled_dot_product_attention(q.unsqueeze(2), kh, vh, attn_mask=group.mask,
                                             scale=self.scale, enable_gqa=True)
        return out.squeeze(2)


@dataclass
class DecodeGroup:
    rows: torch.Tensor  # decode rows (relative to the first decode token) in this group
    blocks: torch.Tensor  # [rows * max_blocks] block ids, padded with block 0
    mask: torch.Tensor | None  # [rows, 1, 1, max_blocks * block_size], True where attended


@dataclass
class TorchPlan:
    # row of each new token's K in the cache viewed as [blocks * 2 * block_size, H, D]
    k_rows: torch.Tensor
    decode_groups: list[DecodeGroup]


# Bytes of gathered K+V per decode group: small enough to stay in a CPU's cache between gather and
# attention.
DECODE_GROUP_BYTES = 8 << 20


def plan_torch(slot_mapping: torch.Tensor, decode_tables: list[list[int]], decode_lens: list[int],
               block_size: int, block_bytes: int) -> TorchPlan:
    """Per-step work for the torch path, shared by all layers."""
    k_rows = slot_mapping + (slot_mapping // block_size) * block_size
    order = sorted(range(len(decode_lens)), key=decode_lens.__getitem__)
    groups, i = [], 0
    while i < len(order):
        width = len(decode_tables[order[i]])
        j = i + 1
        while j < len(order) and (j - i + 1) * len(
                decode_tables[order[j]]) * block_bytes <= DECODE_GROUP_BYTES:
            width = len(decode_tables[order[j]])
            j += 1
        members = order[i:j]
        blocks = [
            b for r in members for b in decode_tables[r] + [0] * (width - len(decode_tables[r]))
        ]
        lens = torch.tensor([decode_lens[r] for r in members])
        mask = None
        if any(decode_lens[r] != width * block_size for r in members):
            mask = (torch.arange(width * block_size).unsqueeze(0) < lens.unsqueeze(1))[:, None,
                                                                                       None, :]
        groups.append(
            DecodeGroup(torch.tensor(members), torch.tensor(blocks, dtype=torch.int64), mask))
        i = j
    return TorchPlan(k_rows, groups)
