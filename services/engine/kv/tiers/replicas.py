"""The host tier under tensor parallelism: each rank keeps its own heads' share of every block.

Rank 0's TierManager decides everything (which blocks to keep, in which host slot, which to load
back and where) and its copy worker sends each round's plan to the other ranks on the step channel
(parallel/channel.py), where TierFollower copies the same device blocks to and from the same slots
of a pool of its own, as large in slots. Slot numbers are all a rank needs: its blocks and slots
hold its own heads, so every rank's plan is rank 0's.

The channel's order makes the copies land in time. A store's plan is sent before rank 0's copy
worker lets the engine reuse the block (TierManager.before_reuse waits for it), so every rank
reads the block before any later step overwrites it; a load's plan is sent before the load counts
as done, and the scheduler runs the request, sending its first step, only after. The copy worker
is one thread, so the ranks reuse slots in rank 0's order. The disk tier below follows rank 0's
the same way, each rank in files of its own (disk_replicas.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from baton.services.engine.kv.layout import byte_view
from baton.services.engine.kv.tiers.disk_replicas import (DiskShare, Reply, TierDiskLoad,
                                                          TierDiskOps, TierDiskStart)
from baton.services.engine.kv.tiers.slots import load_slots, store_slots


@dataclass(frozen=True)
class TierPool:
    """Allocate a host pool of this many block slots (sent once, when rank 0's tier starts)."""
    capacity: int


@dataclass(frozen=True)
class TierStores:
    """Copy each (device block, host slot) pair's block into its slot, after staging the blocks
    these (host slot, block hash) pairs held for the disk tier."""
    pairs: list[tuple[int, int]]
    evicted: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class TierLoads:
    """Copy each (host slot, device block) pair's slot into its block."""
    pairs: list[tuple[int, int]]


TierMessage = TierPool | TierStores | TierLoads | TierDiskStart | TierDiskOps | TierDiskLoad
TIER_MESSAGES = (TierPool, TierStores, TierLoads, TierDiskStart, TierDiskOps, TierDiskLoad)


class TierFollower:
    """A rank other than 0: its host pool, filled and read as rank 0's plans say, and its share of
    the disk tier."""

    def __init__(self, kv_cache: torch.Tensor, rank: int, size: int, reply: Reply) -> None:
        """reply: answers rank 0's disk loads (disk_replicas.py)."""
        self.kv_cache = kv_cache
        self.device_view = byte_view(kv_cache)  # [layers, blocks, block_nbytes]
        self.rank, self.size, self.reply = rank, size, reply
        self.pool: torch.Tensor | None = None
        self.disk: DiskShare | None = None

    def apply(self, message: TierMessage) -> None:
        """Runs between steps, in the channel's order, the host copies done before the next
        message; disk messages go on to the disk share's thread, in the same order."""
        view = self.device_view
        if isinstance(message, TierPool):
            layers, _, nbytes = view.shape
            self.pool = torch.empty((message.capacity, layers, nbytes), dtype=torch.uint8,
                                    pin_memory=view.is_cuda)
            return
        if isinstance(message, TierDiskStart):
            self.disk = DiskShare(self.kv_cache, message, self.rank, self.size, self.reply)
            return
        if isinstance(message, (TierDiskOps, TierDiskLoad)):
            self.disk.put(message)
            return
        if isinstance(message, TierStores):
            if self.disk is not None:
                # Copied out before the stores below overwrite the slots (an empty round frees
                # the last one's).
                self.disk.stage({h: self.pool[slot].numpy().tobytes()
                                 for slot, h in message.evicted})
            store_slots(view, self.pool, message.pairs)
        else:
            load_slots(view, self.pool, message.pairs)
        if view.is_cuda:
            torch.cuda.current_stream(view.device).synchronize()

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()
