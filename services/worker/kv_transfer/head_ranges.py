"""Which KV heads each tensor-parallel rank's cache holds, and which prefill rank each decode rank
reads each of its heads from, when a prefill pool at TP=a hands off to a decode pool at TP=b.

A rank holds KV heads [start, start + count) of the model's (engine/parallel/sharding.py's
HeadSplit): an equal share when the model has at least as many KV heads as ranks, else the one head
its query heads use (replicated over size // kv_heads consecutive ranks). A decode rank's heads are
found on one or more prefill ranks; each head is read from the first prefill rank holding it, and
heads that lie side by side on both sides are read as one slice.
"""
from __future__ import annotations

from dataclasses import dataclass

from baton.services.engine.parallel.sharding import HeadSplit


class TPMismatch(ValueError):
    """Prefill and decode tensor-parallel sizes that cannot hand off (neither divides the other)."""


@dataclass(frozen=True)
class HeadRange:
    """KV heads [start, start + count) of the model's."""
    start: int
    count: int

    @property
    def stop(self) -> int:
        return self.start + self.count


@dataclass(frozen=True)
class HeadRead:
    """Of one prefill rank's cache, `count` heads from its local head `src` go to the decode rank's
    local head `dst`."""
    prefill_rank: int
    src: int
    dst: int
    count: int


def rank_heads(num_heads: int, num_kv_heads: int, rank: int, size: int) -> HeadRange:
    """The KV heads rank `rank` of `size` holds."""
    split = HeadSplit.of(num_heads, num_kv_heads, rank, size)
    return HeadRange(split.kv_start, split.num_kv_heads)


def check_tp_pair(prefill_size: int, decode_size: int) -> None:
    """Raises TPMismatch unless the sizes are equal or one divides the other."""
    if prefill_size % decode_size and decode_size % prefill_size:
        raise TPMismatch(
            f"a prefill pool at --tensor-parallel-size {prefill_size} cannot hand its KV to a "
            f"decode pool at {decode_size}: the sizes must be equal or one must divide the other")


def plan_reads(prefill: list[HeadRange], mine: HeadRange, decode_size: int) -> list[HeadRead]:
    """The slices a decode rank holding `mine`, of `decode_size` ranks, reads, by prefill rank
    (prefill[i] is rank i's heads); raises TPMismatch for sizes that cannot hand off, or a head no
    prefill rank holds."""
    check_tp_pair(len(prefill), decode_size)
    reads: list[HeadRead] = []
    for head in range(mine.start, mine.stop):
        rank = next((r for r, held in enumerate(prefill) if held.start <= head < held.stop), None)
        if rank is None:
            raise TPMismatch(f"no prefill rank holds KV head {head} (the prefill ranks hold "
                             f"{[(h.start, h.stop) for h in prefill]})")
        src, dst = head - prefill[rank].start, head - mine.start
        last = reads[-1] if reads else None
        if last and last.prefill_rank == rank and (last.src, last.dst) == (src - last.count,
                                                                           dst - last.count):
            reads[-1] = HeadRead(rank, last.src, last.dst, last.count + 1)
        else:
            reads.append(HeadRead(rank, src, dst, 1))
    return reads

