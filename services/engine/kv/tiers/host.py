"""The host-memory tier: a pool of block slots allocated once at its setting, so host memory
never exceeds it, kept by LRU under the prefix cache's chained block hashes.

A slot holds one block of every layer, [layers, block_nbytes] bytes, contiguous: one range per
block to copy or write to disk. On a GPU the pool is pinned so that copies are DMA transfers.
With an EAGLE head (speculation/eagle.py), whose cache has the target's block ids, a second pool
of the head's [layers, block_nbytes] per slot holds the head's bytes of the slot's block: a block
leaves and comes back with its head KV, under the same slot and hash.
Not thread-safe: TierManager guards it with its lock.
"""
from __future__ import annotations

from collections import Counter, OrderedDict

import torch


class HostTier:

    def __init__(self, capacity_blocks: int, num_layers: int, block_nbytes: int,
                 pin: bool = False, head: tuple[int, int] | None = None) -> None:
        """head: the head cache's (layers, block_nbytes), for its pool; None without a head."""
        self.capacity = capacity_blocks
        self.pool = torch.empty((capacity_blocks, num_layers, block_nbytes), dtype=torch.uint8,
                                pin_memory=pin)
        self.head_pool = None if head is None else torch.empty(
            (capacity_blocks, *head), dtype=torch.uint8, pin_memory=pin)
        self.block_bytes = num_layers * block_nbytes + (0 if head is None else head[0] * head[1])
        self.index: OrderedDict[int, int] = OrderedDict()  # block hash -> slot, LRU first
        self.free_slots = list(range(capacity_blocks - 1, -1, -1))
        self.pins: Counter[int] = Counter()  # slots being read by a load: never evicted

    @property
    def pools(self) -> list[torch.Tensor]:
        """The target's pool, then the head's when there is one."""
        return [self.pool] if self.head_pool is None else [self.pool, self.head_pool]

    def slot_bytes(self, slot: int) -> bytes:
        """A slot's bytes as the disk tier stores them: the target's, then the head's."""
        return b"".join(pool[slot].numpy().tobytes() for pool in self.pools)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.index

    def __len__(self) -> int:
        return len(self.index)

    def get(self, block_hash: int) -> int | None:
        """The slot holding block_hash, marked most recently used."""
        slot = self.index.get(block_hash)
        if slot is not None:
            self.index.move_to_end(block_hash)
        return slot

    def pin(self, slot: int) -> None:
        self.pins[slot] += 1

    def unpin(self, slot: int) -> None:
        self.pins[slot] -= 1
        if self.pins[slot] <= 0:
            del self.pins[slot]

    def take_slot(self) -> tuple[int, int | None] | None:
        """A slot to write into: a free one, else the least recently used unpinned one, taken out
        of the index. Returns (slot, the hash evicted from it or None), or None when every slot is
        pinned."""
        if self.free_slots:
            return self.free_slots.pop(), None
        for block_hash, slot in self.index.items():
            if slot not in self.pins:
                del self.index[block_hash]
                return slot, block_hash
        return None

    def put(self, block_hash: int, slot: int) -> None:
        self.index[block_hash] = slot

    def release_slot(self, slot: int) -> None:
        """A taken slot that ended up unused."""
        self.free_slots.append(slot)

    @property
    def bytes_used(self) -> int:
        return len(self.index) * self.block_bytes
