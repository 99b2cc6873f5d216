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
is one thread, so the ranks reuse slots in rank 0's order. The disk tier is not mirrored (its
files and evictions are rank 0's alone): EngineConfig refuses it at TP > 1.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from baton.services.engine.kv.layout import byte_view
from baton.services.engine.kv.tiers.slots import load_slots, store_slots


@dataclass(frozen=True)
class TierPool:
    """Allocate a host pool of this many block slots (sent once, when rank 0's tier starts)."""
    capacity: int


@dataclass(frozen=True)
class TierStores:
    """Copy each (device block, host slot) pair's block into its slot."""
    pairs: list[tuple[int, int]]


@dataclass(frozen=True)
class TierLoads:
    """Copy each (host slot, device block) pair's slot into its block."""
    pairs: list[tuple[int, int]]


TierMessage = TierPool | TierStores | TierLoads
# How rank 0's tier reaches the other ranks: the executor's send.
Send = Callable[[Any], None]


class TierFollower:
    """A rank other than 0: its host pool, filled and read as rank 0's plans say."""

    def __init__(self, kv_cache: torch.Tensor) -> None:
        self.device_view = byte_view(kv_cache)  # [layers, blocks, block_nbytes]
        self.pool: torch.Tensor | None = None

    def apply(self, message: TierMessage) -> None:
        """Runs between steps, in the channel's order, the copies done before the next message."""
        view = self.device_view
        if isinstance(message, TierPool):
            layers, _, nbytes = view.shape
            self.pool = torch.empty((message.capacity, layers, nbytes), dtype=torch.uint8,
                                    pin_memory=view.is_cuda)
            return
        if isinstance(message, TierStores):
            store_slots(view, self.pool, message.pairs)
        else:
            load_slots(view, self.pool, message.pairs)
        if view.is_cuda:
            torch.cuda.current_stream(view.device).synchronize()
