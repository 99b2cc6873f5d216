"""The hand-off across tensor-parallel sizes for `baton bench kv-transfer --tp A:B`: decode rank 0
of a pool at TP=B reads its KV heads from a prefill pool at TP=A, each prefill rank played by the
one source process (whose cache holds one prefill rank's heads), in the pieces the two caches'
orders allow (descriptors.head_slice_tables). Counting those pieces needs no cache at all."""
from __future__ import annotations

from dataclasses import dataclass

from baton.services.engine.kv.layout import KVLayout
from baton.services.worker.kv_transfer.descriptors import HeadSlice, head_slice_tables
from baton.services.worker.kv_transfer.head_ranges import (HeadRead, check_tp_pair, plan_reads,
                                                           rank_heads)

# Query heads per KV head for the plan: any group lets TP split up to this many times KV heads.
_GROUP = 8


@dataclass(frozen=True)
class TPPair:
    prefill: int
    decode: int

    @classmethod
    def parse(cls, text: str) -> "TPPair":
        """'A:B' -> TPPair(A, B); raises ValueError naming --tp."""
        try:
            prefill, decode = (int(x) for x in text.split(":"))
        except ValueError:
            raise ValueError(f"--tp {text!r}: expected PREFILL:DECODE sizes, e.g. 4:8") from None
        if min(prefill, decode) < 1:
            raise ValueError(f"--tp {text!r}: sizes must be at least 1")
        check_tp_pair(prefill, decode)
        return cls(prefill, decode)

    def heads(self, kv_heads: int) -> tuple[int, int]:
        """KV heads of one prefill rank's cache, and of decode rank 0's."""
        return (rank_heads(kv_heads * _GROUP, kv_heads, 0, self.prefill).count,
                rank_heads(kv_heads * _GROUP, kv_heads, 0, self.decode).count)

    def reads(self, kv_heads: int) -> list[HeadSlice]:
        """Decode rank 0's head slices, one per (prefill rank, run of heads)."""
        prefill = [rank_heads(kv_heads * _GROUP, kv_heads, r, self.prefill)
                   for r in range(self.prefill)]
        mine = rank_heads(kv_heads * _GROUP, kv_heads, 0, self.decode)
        src_heads, dst_heads = self.heads(kv_heads)
        plan: list[HeadRead] = plan_reads(prefill, mine, self.decode)
        return [HeadSlice(r.src, r.dst, r.count, src_heads, dst_heads) for r in plan]


def piece_count(local: KVLayout, remote: KVLayout, parts: list[HeadSlice], blocks: int) -> int:
    """Address pieces decode rank 0 moves for a hand-off of `blocks` scattered blocks."""
    ids = list(range(blocks))
    return sum(head_slice_tables(local, remote, ids, ids, part, 0, 0)[0].shape[0]
               for part in parts)


def count_report(layers: int, block_size: int, kv_heads: int, head_dim: int, itemsize: int,
                 tp: TPPair, tokens: int) -> list[str]:
    """Lines: pieces and bytes per piece decode rank 0 reads of a `tokens`-token hand-off, for
    each pair of (prefill, decode) cache orders."""
    blocks = -(-tokens // block_size)
    src_heads, dst_heads = tp.heads(kv_heads)
    lines = [f"TP {tp.prefill} -> {tp.decode}, {layers} layers, {kv_heads} KV heads x {head_dim}, "
             f"{tokens} tokens ({blocks} blocks of {block_size}): pieces per decode rank"]
    for remote_order, local_order in (("NHD", "NHD"), ("HND", "HND"), ("HND", "NHD")):
        # A cache of one KV head is both orders, and says HND (layout.order_of).
        layouts = [KVLayout(layers, blocks, block_size,
                            2 * block_size * n * head_dim * itemsize, 0, "",
                            "HND" if n == 1 else order)
                   for n, order in ((dst_heads, local_order), (src_heads, remote_order))]
        pieces = piece_count(layouts[0], layouts[1], tp.reads(kv_heads), blocks)
        moved = layers * blocks * layouts[0].block_nbytes
        both = " (one KV head a rank: both orders)" if 1 in (src_heads, dst_heads) else ""
        lines.append(f"  prefill {remote_order} -> decode {local_order}: {pieces:>12,} pieces, "
                     f"{moved // max(pieces, 1):>8,} bytes each{both}")
    return lines

