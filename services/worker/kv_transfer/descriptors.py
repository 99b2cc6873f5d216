"""Address ranges of a KV read: one (address, length, device) row per contiguous piece, on each
side.

A run of blocks consecutive on both sides is one range per layer (the cache's layout and why:
baton.services.engine.kv.layout); a fragmented cache falls back to a range per (layer, block).
"""
from __future__ import annotations

import numpy as np

from baton.services.engine.kv.layout import KVLayout, block_runs


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
