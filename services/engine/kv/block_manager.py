"""Paged KV-cache bookkeeping: block allocation, reference counts and the prefix cache.

Free blocks sit in one LRU queue. Blocks without a hash go to its front (reused first); freed cached
blocks go to its back and stay hittable until allocation reaches and evicts them.

With an `offload` (kv/tiers: TierManager), a cached block that loses its last user is handed to it
to copy to a lower tier, and a block is not reused before that copy has read it.

With `record_events`, every block that becomes hittable or stops being so is logged in `events`
(drained by the worker, which publishes them so the router's prefix index mirrors this cache).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Literal, Protocol

from baton.services.engine.sequence import Sequence


BlockEvent = tuple[Literal["stored", "removed"], int]  # (what happened, block hash)
Medium = Literal["device", "host", "disk"]  # where a block is: the device cache or a KV tier
MediumEvent = tuple[Literal["stored", "removed"], int, Medium]  # a BlockEvent and where


class Offload(Protocol):
    def store(self, block: int, block_hash: int) -> None: ...

    def before_reuse(self, block: int) -> None: ...


class BlockManager:

    def __init__(self, num_blocks: int, block_size: int, model_id: str,
                 enable_prefix_caching: bool = True, record_events: bool = False) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.model_id = model_id
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.record_events = record_events
        self.events: list[BlockEvent] = []
        self.offload: Offload | None = None

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, seq: Sequence, keep_last: bool = True) -> list[int]:
        """Block ids holding seq's longest cached prefix. With keep_last, the last token is left to
        compute: the model must run on at least one token to produce logits, and a shared block must
        never be rewritten. A hand-off's receiver computes nothing and passes keep_last=False."""
        if not self.enable_prefix_caching:
            return []
        hashes = seq.full_block_hashes(self.block_size, self.model_id)
        limit = (seq.num_tokens - int(keep_last)) // self.block_size
        hits = []
        for h in hashes[:limit]:
            block = self.cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def can_admit(self, hit_blocks: list[int], num_tokens: int) -> bool:
        """Whether hits can be pinned and the rest of num_tokens allocated."""
        reclaimed = sum(1 for b in hit_blocks if self.ref_counts[b] == 0)
        new = self.blocks_needed(num_tokens) - len(hit_blocks)
        return new <= self.num_free_blocks - reclaimed

    def admit(self, seq: Sequence, hit_blocks: list[int]) -> None:
        for b in hit_blocks:
            if self.ref_counts[b] == 0:
                del self.free_queue[b]
            self.ref_counts[b] += 1
        seq.block_ids = list(hit_blocks)
        seq.num_computed_tokens = len(hit_blocks) * self.block_size

    def can_grow(self, seq: Sequence, num_tokens: int) -> bool:
        return self.blocks_needed(num_tokens) - len(seq.block_ids) <= self.num_free_blocks

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """Gives seq enough blocks to hold num_tokens tokens."""
        for _ in range(self.blocks_needed(num_tokens) - len(seq.block_ids)):
            seq.block_ids.append(self._allocate())

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Gives back the blocks past what num_tokens tokens need: those a rejected speculative
        draft took. Never hashed (only computed tokens' blocks are), they are reused first."""
        keep = self.blocks_needed(num_tokens)
        for block in reversed(seq.block_ids[keep:]):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue[block] = None
                self.free_queue.move_to_end(block, last=False)
        del seq.block_ids[keep:]

    def _allocate(self) -> int:
        block, _ = self.free_queue.popitem(last=False)
        old_hash = self.block_hash[block]
        if old_hash is not None:
            if self.offload is not None:
                self.offload.before_reuse(block)
            del self.cached[old_hash]
            self.block_hash[block] = None
            if self.record_events:
                self.events.append(("removed", old_hash))
        self.ref_counts[block] = 1
        return block

    def cache_full_blocks(self, seq: Sequence, old_computed: int) -> None:
        """Registers the blocks that the last step filled, so later requests can hit them."""
        if not self.enable_prefix_caching:
            return
        first, end = old_computed // self.block_size, seq.num_computed_tokens // self.block_size
        if end <= first:
            return
        hashes = seq.full_block_hashes(self.block_size, self.model_id)
        for i in range(first, end):
            block, h = seq.block_ids[i], hashes[i]
            if self.block_hash[block] is None and h not in self.cached:
                self.block_hash[block] = h
                self.cached[h] = block
                if self.record_events:
                    self.events.append(("stored", h))

    def free(self, seq: Sequence, offload: bool = True) -> None:
        """Releases seq's blocks; the tail goes back first so that cached heads outlive their
        tails. offload=False: the cached ones are not copied to a lower tier (recompute
        preemption)."""
        for block in reversed(seq.block_ids):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue[block] = None
                block_hash = self.block_hash[block]
                if block_hash is None:
                    self.free_queue.move_to_end(block, last=False)
                elif offload and self.offload is not None:
                    self.offload.store(block, block_hash)
        seq.block_ids = []
