"""A rank's share of the disk KV tier under tensor parallelism
(services/engine/kv/tiers/disk_replicas.py), driven by rank 0's messages in one process: at start
it keeps only the files rank 0 indexed; a block pushed out of a host slot is written from the
bytes staged before that slot's reuse; a load copies whole files into device blocks and answers how
many leading ones landed, stopping at a dropped one."""
from __future__ import annotations

import queue
from pathlib import Path

import torch

from baton.services.engine.kv.layout import byte_view
from baton.services.engine.kv.tiers.disk import encode
from baton.services.engine.kv.tiers.disk_replicas import (TierDiskLoad, TierDiskOps,
                                                          TierDiskStart, share_dir)
from baton.services.engine.kv.tiers.replicas import TierFollower, TierPool, TierStores


def _name(block_hash: int) -> str:
    return f"{block_hash:016x}.kv"


def test_follower_share_follows_rank0(tmp_path: Path) -> None:
    # [layers, blocks, K/V, block_size, kv_heads, head_dim]
    cache = torch.randn(2, 6, 2, 4, 2, 3, generator=torch.Generator().manual_seed(0))
    view = byte_view(cache)
    replies: queue.SimpleQueue = queue.SimpleQueue()
    follower = TierFollower(cache, 1, 2, lambda *answer: replies.put(answer))
    share = share_dir(tmp_path, 1, 2)
    share.mkdir(parents=True)
    for block_hash in (1, 2):  # a previous run's: rank 0 indexes only the first
        (share / _name(block_hash)).write_bytes(encode(block_hash, bytes(view[:, 0].numel())))
    try:
        follower.apply(TierPool(2))
        follower.apply(TierDiskStart(str(tmp_path), 1 << 30, keep=[1]))
        assert sorted(p.name for p in share.iterdir()) == [_name(1)]
        follower.apply(TierStores([(0, 0), (1, 1)]))
        evicted = view[:, 0].clone()
        # The next round reuses slot 0 for block 2; its old block (hash 10) goes to disk.
        follower.apply(TierStores([(2, 0)], evicted=[(0, 10)]))
        follower.apply(TierDiskOps([(True, 10), (False, 1)]))
        assert not torch.equal(view[:, 5], evicted)
        follower.apply(TierDiskLoad([(10, 5), (1, 4)], task_id=7))
        assert replies.get(timeout=60) == (7, 1, None)
        assert torch.equal(view[:, 5], evicted)
        assert sorted(p.name for p in share.iterdir()) == [_name(10)]
    finally:
        follower.close()
