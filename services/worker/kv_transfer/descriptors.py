"""Address ranges of a KV read: one (address, length, device) row per contiguous piece, on each
side.

A run of blocks consecutive on both sides is one range per layer (the cache's layout and why:
baton.services.engine.kv.layout); a fragmented cache falls back to a range per (layer, block). A
read across tensor-parallel sizes moves a slice of each block's heads (head_slice_tables).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from baton.services.engine.kv.layout import KVLayout, block_runs
from baton.services.worker.kv_transfer.base import KVPeer, KVTransferError, check_read


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


@dataclass(frozen=True)
class HeadSlice:
    """Part of a read across tensor-parallel sizes: `count` KV heads from the remote cache's local
    head `src` into the local cache's head `dst`, each side's blocks holding `*_heads` heads."""
    src: int
    dst: int
    count: int
    remote_heads: int
    local_heads: int


def head_bytes(layout: KVLayout, heads: int) -> int:
    """Bytes of one head in one token's K (or V) row of a block."""
    return layout.block_nbytes // (2 * layout.block_size * heads)


def _slice_addresses(layout: KVLayout, blocks: list[int], heads: int, first: int) -> np.ndarray:
    """Start of head `first` in every (layer, block, K/V row) of `blocks`, layer-major."""
    row_bytes = layout.block_nbytes // (2 * layout.block_size)
    layers = np.arange(layout.num_layers, dtype=np.uint64)[:, None, None]
    ids = np.asarray(blocks, dtype=np.uint64)[None, :, None]
    rows = np.arange(2 * layout.block_size, dtype=np.uint64)[None, None, :]
    starts = ((layers * np.uint64(layout.num_blocks) + ids) * np.uint64(layout.block_nbytes)
              + rows * np.uint64(row_bytes))
    return (np.uint64(layout.base_address) + starts
            + np.uint64(first * head_bytes(layout, heads))).ravel()


def head_slice_tables(local: KVLayout, remote: KVLayout, remote_blocks: list[int],
                      local_blocks: list[int], part: HeadSlice, local_device: int,
                      remote_device: int) -> tuple[np.ndarray, np.ndarray]:
    """The local and remote range tables of a head-slice read: one range per (layer, block, token,
    K/V), since a block's heads lie innermost but one ([block_size, heads, head_dim] for K, then
    V), so a subset of heads is contiguous only within one token's row."""
    length = np.uint64(part.count * head_bytes(local, part.local_heads))
    tables = []
    for layout, blocks, heads, first, device in (
            (local, local_blocks, part.local_heads, part.dst, local_device),
            (remote, remote_blocks, part.remote_heads, part.src, remote_device)):
        addresses = _slice_addresses(layout, blocks, heads, first)
        table = np.empty((addresses.size, 3), dtype=np.uint64)
        table[:, 0], table[:, 1], table[:, 2] = addresses, length, device
        tables.append(table)
    return tables[0], tables[1]


def check_head_read(local: KVLayout, peer: KVPeer, remote_blocks: list[int],
                    local_blocks: list[int], part: HeadSlice) -> None:
    """Refuses, before anything moves, a head-slice read the two layouts cannot serve: they must
    agree on all but the heads per block, and the slice must lie within both sides' heads. Raises
    KVTransferError."""
    remote = peer.layout
    if ((remote.num_layers, remote.block_size, remote.dtype) != (
            local.num_layers, local.block_size, local.dtype)
            or head_bytes(remote, part.remote_heads) != head_bytes(local, part.local_heads)):
        raise KVTransferError(
            f"peer {peer.name}'s cache layout {remote} ({part.remote_heads} KV heads) does not "
            f"match the local one {local} ({part.local_heads} KV heads)", "invalid")
    if part.src + part.count > part.remote_heads or part.dst + part.count > part.local_heads:
        raise KVTransferError(f"head slice {part} lies outside the caches' heads", "invalid")
    check_read(replace(local, block_nbytes=remote.block_nbytes), peer, remote_blocks,
               local_blocks)
