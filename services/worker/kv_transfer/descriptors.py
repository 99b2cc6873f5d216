"""Address ranges of a KV read: one (address, length, device) row per contiguous piece, on each
side.

A run of blocks consecutive on both sides is one range per layer (the cache's layout and why:
baton.services.engine.kv.layout); a fragmented cache falls back to a range per (layer, block). A
read across tensor-parallel sizes, or between caches of different in-block orders, moves a slice
of each block's heads (head_slice_tables), in pieces as large as both orders allow.
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


def run_tables(pairs: list[tuple[KVLayout, KVLayout]], remote_blocks: list[int],
               local_blocks: list[int], device: int) -> tuple[np.ndarray, np.ndarray]:
    """The local and remote range tables of a read over several caches, each pair's (local,
    remote) layouts in turn, one range per (layer, run) (a run may be one block)."""
    runs = block_runs(remote_blocks, local_blocks)
    lengths = [n for _, _, n in runs]
    local = [run_table(mine, [l0 for _, l0, _ in runs], lengths, device) for mine, _ in pairs]
    remote = [run_table(theirs, [r0 for r0, _, _ in runs], lengths, device)
              for _, theirs in pairs]
    return np.concatenate(local), np.concatenate(remote)


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


def slice_mode(local: KVLayout, remote: KVLayout) -> str:
    """The pieces a head-slice read between two caches' orders moves (head_slice_tables)."""
    if local.order == remote.order:
        return "head_run" if local.order == "HND" else "token_row"
    return "token_head"


def _slice_addresses(layout: KVLayout, blocks: list[int], heads: int, first: int, count: int,
                     mode: str) -> np.ndarray:
    """Start of every piece of heads [first, first + count) in `blocks`, over (layer, block, K/V,
    token, head) in that order: one token (axis of length 1) for head_run, one head for
    token_row."""
    u = np.uint64
    one = head_bytes(layout, heads)
    size, half = layout.block_size, layout.block_nbytes // 2
    layers = np.arange(layout.num_layers, dtype=u)[:, None, None, None, None]
    ids = np.asarray(blocks, dtype=u)[None, :, None, None, None]
    kv = np.arange(2, dtype=u)[None, None, :, None, None]
    tokens = np.arange(1 if mode == "head_run" else size, dtype=u)[None, None, None, :, None]
    head_ids = first + np.arange(count if mode == "token_head" else 1, dtype=u)
    head_ids = head_ids[None, None, None, None, :]
    if layout.order == "HND":  # [2, heads, block_size, head_dim]
        within = head_ids * u(size * one) + tokens * u(one)
    else:  # [2, block_size, heads, head_dim]
        within = tokens * u(heads * one) + head_ids * u(one)
    starts = (layers * u(layout.num_blocks) + ids) * u(layout.block_nbytes) + kv * u(half) + within
    return (u(layout.base_address) + starts).ravel()


def piece_bytes(local: KVLayout, part: HeadSlice, mode: str) -> int:
    """Bytes of one piece of a head-slice read moving `mode`'s pieces (slice_mode)."""
    one = head_bytes(local, part.local_heads)
    return {"head_run": part.count * local.block_size * one, "token_row": part.count * one,
            "token_head": one}[mode]


def head_slice_tables(local: KVLayout, remote: KVLayout, remote_blocks: list[int],
                      local_blocks: list[int], part: HeadSlice, local_device: int,
                      remote_device: int) -> tuple[np.ndarray, np.ndarray]:
    """The local and remote range tables of a head-slice read. The pieces follow both orders:
    between two HND caches a run of heads is contiguous within each (layer, block, K/V), so one
    piece each; between two NHD caches only within one token's row, so block_size pieces; across
    orders only one (token, head) of head_dim values is contiguous on both sides."""
    mode = slice_mode(local, remote)
    length = np.uint64(piece_bytes(local, part, mode))
    tables = []
    for layout, blocks, heads, first, device in (
            (local, local_blocks, part.local_heads, part.dst, local_device),
            (remote, remote_blocks, part.remote_heads, part.src, remote_device)):
        addresses = _slice_addresses(layout, blocks, heads, first, part.count, mode)
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
    check_read(replace(local, block_nbytes=remote.block_nbytes, order=remote.order), peer,
               remote_blocks, local_blocks)
