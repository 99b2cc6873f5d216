"""Address ranges of a KV read: one (address, length, device) row per contiguous piece, on each
side.

The cache is [layers, blocks, 2, block_size, kv_heads, head_dim], so within one layer consecutive
block ids are adjacent in memory: a run of blocks that is consecutive on both sides (remote b..b+k,
local l..l+k) is one range per layer instead of k. A fresh prompt's blocks usually come from the
allocator's free list in order, so whole prompts often collapse to a few runs; a fragmented cache
falls back to a range per (layer, block).

Why not a block-major layout ([blocks, layers, ...], one range per block for all layers)? It would
make every block one range even when scattered, but the attention kernels and CUDA graphs index the
cache per layer (`kv_cache[layer]` must be one strided tensor over all blocks), and changing the
engine's layout is out of proportion for what runs already give: with consecutive blocks the
layer-major layout needs only `layers` ranges per run, and on one node the CUDA IPC transport
gathers scattered blocks in a single kernel regardless.
"""
from __future__ import annotations

import numpy as np

from baton.services.worker.kv_transfer.base import KVLayout


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


def run_table(layout: KVLayout, starts: list[int], lengths: list[int],
              device_id: int) -> np.ndarray:
    """(address, length, device) per (layer, run), layer-major, for runs starting at block
    `starts[i]`."""
    starts_arr = np.asarray(starts, dtype=np.uint64)
    lengths_arr = np.asarray(lengths, dtype=np.uint64)
    layer_offsets = np.arange(layout.num_layers, dtype=np.uint64) * np.uint64(layout.num_blocks)
    rows = (layer_offsets[:, None] + starts_arr[None, :]).ravel()
    table = np.empty((rows.size, 3), dtype=np.uint64)
    table[:, 0] = np.uint64(layout.base_address) + rows * np.uint64(layout.block_nbytes)
    table[:, 1] = np.tile(lengths_arr, layout.num_layers) * np.uint64(layout.block_nbytes)
    table[:, 2] = device_id
    return table


def coalesced_tables(local: KVLayout, remote: KVLayout, remote_blocks: list[int],
                     local_blocks: list[int], local_device: int,
                     remote_device: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The local and remote range tables of a read with its runs merged, or None when no two blocks
    merge (then the prepared per-(layer, block) lists serve it without building anything)."""
    runs = block_runs(remote_blocks, local_blocks)
    if len(runs) == len(remote_blocks):
        return None
    lengths = [n for _, _, n in runs]
    return (run_table(local, [l0 for _, l0, _ in runs], lengths, local_device),
            run_table(remote, [r0 for r0, _, _ in runs], lengths, remote_device))
