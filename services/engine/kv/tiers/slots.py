"""Copies between device blocks and host slots or disk payloads: the copy worker's (rank 0's, and
the only one at TP=1) and, under tensor parallelism, the other ranks' (replicas.py,
disk_replicas.py)."""
from __future__ import annotations

import torch

from baton.services.engine.kv.layout import block_runs


def store_slots(view: torch.Tensor, pool: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
    """Each (device block, host slot) pair's block into its slot: one gather on the device, then
    one copy per run of consecutive slots (asynchronous on a GPU: the caller synchronizes)."""
    blocks = torch.tensor([b for b, _ in pairs], device=view.device)
    gathered = view.index_select(1, blocks).transpose(0, 1).contiguous()
    for slot, first, count in block_runs([s for _, s in pairs], list(range(len(pairs)))):
        pool[slot:slot + count].copy_(gathered[first:first + count], non_blocking=True)


def load_slots(view: torch.Tensor, pool: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
    """Each (host slot, device block) pair's slot into its block: pinned slots straight to a device
    buffer, one DMA per run of consecutive slots (a CPU gather first would copy from pageable
    memory at a fraction of the bus's speed), then one scatter into the cache's blocks."""
    rows = torch.empty((len(pairs), *pool.shape[1:]), dtype=pool.dtype, device=view.device)
    for slot, first, count in block_runs([s for s, _ in pairs], list(range(len(pairs)))):
        rows[first:first + count].copy_(pool[slot:slot + count], non_blocking=True)
    blocks = torch.tensor([b for _, b in pairs], device=view.device)
    view.index_copy_(1, blocks, rows.transpose(0, 1))


def copy_payload(view: torch.Tensor, block: int, payload: bytes | memoryview) -> None:
    """A block's bytes as read from disk, [layers, block_nbytes], into device block `block`."""
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    view[:, block].copy_(data.view(view.shape[0], view.shape[2]))


def copy_payloads(views: list[torch.Tensor], block: int, payload: bytes) -> None:
    """A disk payload of several caches' bytes of a block, one after the other in views' order
    (HostTier.slot_bytes), each into its cache's block `block`."""
    data, start = memoryview(payload), 0
    for view in views:
        size = view.shape[0] * view.shape[2]
        copy_payload(view, block, data[start:start + size])
        start += size
