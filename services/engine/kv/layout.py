"""Where each block of the paged KV cache lies in memory, and how blocks line up for a copy.

The cache is [layers, blocks, 2, block_size, kv_heads, head_dim] (kv_cache.allocate), so each
(layer, block) pair, K and V together, is one contiguous range of `block_nbytes` bytes at
`base_address + (layer * num_blocks + block) * block_nbytes`, and within one layer consecutive
block ids are adjacent in memory: a run of blocks consecutive on both sides of a copy (source
b..b+k, destination l..l+k) is one range per layer instead of k. A fresh prompt's blocks usually
come from the allocator's free list in order, so whole prompts often collapse to a few runs.

Why not a block-major layout ([blocks, layers, ...], one range per block for all layers)? It would
make every block one range even when scattered, but the attention kernels and CUDA graphs index the
cache per layer (`kv_cache[layer]` must be one strided tensor over all blocks), and changing the
layout is out of proportion for what runs already give: with consecutive blocks the layer-major
layout needs only `layers` ranges per run, and scattered blocks on one device are gathered in a
single kernel regardless (block_copy.py).

Within a block, two orders (EngineConfig.kv_cache_layout, vLLM's names): NHD, token-major, stores
each (layer, block, K/V) as [block_size, kv_heads, head_dim]; HND, head-major, as [kv_heads,
block_size, head_dim]. The engine sees the same logical shape either way (an HND cache is a
strided view of its head-major storage, which the kernels and the torch path index through
strides), and a (layer, block) is one contiguous range in both. What HND buys is the hand-off
across tensor-parallel sizes: a decode rank reads a run of heads of each block, which is one
contiguous piece per (layer, block, K/V) in HND, but block_size pieces (one per token) in NHD.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Order = Literal["NHD", "HND"]
ORDERS: tuple[Order, ...] = ("NHD", "HND")


@dataclass(frozen=True)
class KVLayout:
    num_layers: int
    num_blocks: int
    block_size: int  # tokens per block
    block_nbytes: int  # bytes of one (layer, block): K and V together
    base_address: int
    dtype: str
    order: str = "NHD"  # within a block: "NHD" token-major, "HND" head-major

    @classmethod
    def of(cls, kv_cache: torch.Tensor) -> "KVLayout":
        layers, blocks, _, block_size = kv_cache.shape[:4]
        return cls(layers, blocks, block_size, kv_cache[0, 0].numel() * kv_cache.element_size(),
                   kv_cache.data_ptr(), str(kv_cache.dtype).removeprefix("torch."),
                   order_of(kv_cache))


def order_of(kv_cache: torch.Tensor) -> Order:
    """The in-block order of a cache of logical shape [layers, blocks, 2, block_size, kv_heads,
    head_dim] (kv_cache.allocate's); raises ValueError for any other memory layout. A cache of one
    KV head (a TP rank's share, often) or one-token blocks is both: its bytes are the same in
    either order, so it says HND, whose head-slice pieces are the larger."""
    if kv_cache.transpose(3, 4).is_contiguous():
        return "HND"
    if kv_cache.is_contiguous():
        return "NHD"
    raise ValueError(f"a KV cache of strides {kv_cache.stride()} is neither NHD nor HND")


def storage(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache in its memory order, contiguous: itself (NHD), or [layers, blocks, 2, kv_heads,
    block_size, head_dim] (HND); what registration and byte copies address."""
    return kv_cache.transpose(3, 4) if order_of(kv_cache) == "HND" else kv_cache


def byte_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache as [layers, blocks, block_nbytes] bytes, sharing its memory. Bytes of one layout
    mean nothing to the other: byte copies stay between caches of one order."""
    layers, blocks = kv_cache.shape[:2]
    return storage(kv_cache).view(torch.uint8).view(layers, blocks, -1)


def block_runs(remote_blocks: list[int], local_blocks: list[int]) -> list[tuple[int, int, int]]:
    """(remote_start, local_start, length) of the maximal runs, in order, where both sides step by
    +1."""
    runs: list[tuple[int, int, int]] = []
    for remote, local in zip(remote_blocks, local_blocks):
        if runs:
            r0, l0, n = runs[-1]
            if remote == r0 + n and local == l0 + n:
                runs[-1] = (r0, l0, n + 1)
                continue
        runs.append((remote, local, 1))
    return runs
