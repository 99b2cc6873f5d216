"""The NIXL hand-off across tensor-parallel sizes: a prefill pool at TP=a, a decode pool at TP=b
(b = a, or one divides the other).

Every rank registers its own cache with a NIXL agent of its own (rank 0's is the worker's transport;
the other ranks open theirs when the worker starts, told through the rank channel), so a prefill
worker's KV handle lists every rank's agent and the KV heads its cache holds (KVRankPeer). A decode
worker's rank 0 asks each of its other ranks to read their share (a rank task, on a thread of the
rank's own) and reads its own meanwhile: each decode rank reads the heads it holds from the prefill
ranks that hold them (head_ranges.py), a whole block per (layer, block) when both ranks hold the
same heads in the same order, else a slice of each block (descriptors.head_slice_tables: one piece
per (layer, block, K/V) between HND caches, one per token between NHD ones, one per token and head
across orders). Only when every rank is done does rank 0 notify prefill rank 0, so the lease, the
notification that frees the blocks and the quarantine of a timed-out read stay the one contract of
engine/kv/handoff.py: a read fails as a whole, with the worst of its ranks' reasons (a timeout
anywhere parks the blocks on every rank, since they are the same block ids). An EAGLE head lives on
rank 0 alone: decode rank 0 reads its blocks from prefill rank 0 after its own share, before the
notification, when both heads' caches have one shape.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from baton.services.engine.parallel.executor import Executor, free_port
from baton.services.engine.parallel.rank_tasks import RankContext, RankTask, RankTaskFailed
from baton.services.worker.kv_transfer.base import (KVPeer, KVRankPeer, KVTransferError,
                                                    KVTransport, TransferResult, heads_match)
from baton.services.worker.kv_transfer.descriptors import HeadSlice
from baton.services.worker.kv_transfer.head_ranges import HeadRange, plan_reads, rank_heads
from baton.services.worker.kv_transfer.nixl_transport import NixlKVTransport
from baton.services.worker.kv_transfer.telemetry import TransferMetrics, observe_read

_STATE_KEY = "kv_transport"
# How long the other ranks may take to open their agents, and past a read's own timeout to answer.
AGENT_START_S, ANSWER_MARGIN_S = 120.0, 30.0
# Of a read's ranks' failures, the one reported: a timeout first (its blocks must be parked).
_REASONS = ("timeout", "failed", "unreachable", "invalid")


def _model_heads(config: Any, rank: int, size: int) -> HeadRange:
    return rank_heads(config.num_attention_heads, config.num_key_value_heads, rank, size)


def _rank_peer(peer: KVPeer, heads: HeadRange) -> KVRankPeer:
    return KVRankPeer(peer.name, peer.host, peer.port, peer.layout, heads.start, heads.count)


def prefill_ranks(peer: KVPeer, num_kv_heads: int) -> list[tuple[KVPeer, HeadRange]]:
    """Each prefill rank's agent and heads; a peer without ranks is one cache of every head."""
    if not peer.ranks:
        return [(replace(peer, ranks=()), HeadRange(0, num_kv_heads))]
    return [(KVPeer(r.agent_name, r.agent_host, r.agent_port, r.layout),
             HeadRange(r.kv_head_start, r.kv_head_count)) for r in peer.ranks]


def read_rank_share(transport: NixlKVTransport, peer: KVPeer, mine: HeadRange, size: int,
                    num_kv_heads: int, blocks: tuple[list[int], list[int]],
                    timeout_s: float) -> int:
    """Reads this decode rank's heads of the (remote, local) blocks from the prefill ranks holding
    them; returns the bytes read. Raises KVTransferError ("invalid" for sizes that cannot hand
    off)."""
    deadline = time.perf_counter() + timeout_s
    ranks = prefill_ranks(peer, num_kv_heads)
    try:
        plan = plan_reads([heads for _, heads in ranks], mine, size)
    except ValueError as e:
        raise KVTransferError(str(e), "invalid") from e
    num_bytes = 0
    for read in plan:
        rank_peer, heads = ranks[read.prefill_rank]
        part = HeadSlice(read.src, read.dst, read.count, heads.count, mine.count)
        left = max(deadline - time.perf_counter(), 0.001)
        num_bytes += transport.read_heads(rank_peer, *blocks, part, left).num_bytes
    return num_bytes


@dataclass
class OpenRankAgent(RankTask):
    """A rank other than 0 registers its cache with a NIXL agent of its own; answers its
    KVRankPeer. The agent listens on the worker's address (`host`) when the rank shares rank 0's
    node, else on its own node's."""
    name: str
    host: str
    ucx_tls: str | None

    def run(self, ctx: RankContext) -> KVRankPeer:
        host = ctx.node_host or self.host
        transport = NixlKVTransport(ctx.kv_cache, f"{self.name}-rank{ctx.rank}", host,
                                    free_port(host), None, self.ucx_tls)
        ctx.state[_STATE_KEY] = transport
        return _rank_peer(transport.local_peer(), _model_heads(ctx.config, ctx.rank, ctx.size))


@dataclass
class ReadRankShare(RankTask):
    """A decode rank other than 0 reads its heads of a hand-off; answers (bytes, None) or (0,
    (reason, message))."""
    peer: KVPeer
    remote_blocks: list[int]
    local_blocks: list[int]
    timeout_s: float
    inline = False

    def run(self, ctx: RankContext) -> tuple[int, tuple[str, str] | None]:
        transport: NixlKVTransport = ctx.state[_STATE_KEY]
        try:
            return read_rank_share(transport, self.peer,
                                   _model_heads(ctx.config, ctx.rank, ctx.size), ctx.size,
                                   ctx.config.num_key_value_heads,
                                   (self.remote_blocks, self.local_blocks), self.timeout_s), None
        except KVTransferError as e:
            return 0, (e.reason, str(e))


def _severity(error: KVTransferError) -> int:
    return _REASONS.index(error.reason) if error.reason in _REASONS else len(_REASONS)


class HeadShardedTransport(KVTransport):
    """Rank 0's NIXL transport at any TP size, reading from a prefill worker at any TP size the
    sizes allow. A read from one cache into one cache (TP=1 on both sides) is the plain NIXL read,
    unchanged."""

    name = "nixl"

    def __init__(self, inner: NixlKVTransport, heads: tuple[int, int], executor: Executor | None,
                 metrics: TransferMetrics | None, ucx_tls: str | None) -> None:
        """heads: the model's (query heads, KV heads)."""
        self._inner, self._executor, self._metrics = inner, executor, metrics
        self._size = executor.size if executor is not None else 1
        self._num_kv_heads = heads[1]
        self._heads = rank_heads(*heads, 0, self._size)
        own = _rank_peer(inner.local_peer(), self._heads)
        self._ranks: tuple[KVRankPeer, ...] = ()
        if executor is not None:
            peer = inner.local_peer()
            task = executor.post(OpenRankAgent(peer.name, peer.host, ucx_tls))
            self._ranks = (own, *executor.wait(task, AGENT_START_S))

    def local_peer(self) -> KVPeer:
        return self._inner.local_peer()

    def rank_peers(self) -> tuple[KVRankPeer, ...]:
        return self._ranks

    def read(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
             notification: bytes, timeout_s: float) -> TransferResult:
        same_order = peer.layout.order == self._inner.local_peer().layout.order
        if not peer.ranks and self._size == 1 and same_order:
            return self._inner.read(peer, remote_blocks, local_blocks, notification, timeout_s)
        return observe_read(
            self._metrics, self.name, notification.decode("utf-8", "replace"),
            lambda: self._read_sharded(peer, remote_blocks, local_blocks, notification,
                                       timeout_s))

    def _read_sharded(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
                      notification: bytes, timeout_s: float) -> TransferResult:
        start = time.perf_counter()
        task = None
        if self._executor is not None:
            task = self._executor.post(ReadRankShare(peer, remote_blocks, local_blocks,
                                                     timeout_s))
        errors: list[KVTransferError] = []
        num_bytes = 0
        first, _ = prefill_ranks(peer, self._num_kv_heads)[0]
        first = replace(first, head_layout=peer.head_layout)
        try:
            num_bytes = read_rank_share(self._inner, peer, self._heads, self._size,
                                        self._num_kv_heads, (remote_blocks, local_blocks),
                                        timeout_s)
            if heads_match(self._inner.local_peer().head_layout, peer.head_layout):
                left = max(start + timeout_s - time.perf_counter(), 0.001)
                num_bytes += self._inner.read_head(first, remote_blocks, local_blocks,
                                                   left).num_bytes
        except KVTransferError as e:
            errors.append(e)
        if task is not None:
            # Every rank's answer, even after a failure here: until then a rank may still write.
            followers, more = self._followers(task, timeout_s + ANSWER_MARGIN_S)
            num_bytes, errors = num_bytes + followers, errors + more
        if errors:
            raise min(errors, key=_severity)
        self._inner.notify(first, notification, max(start + timeout_s - time.perf_counter(), 1.0))
        return TransferResult(num_bytes, time.perf_counter() - start)

    def _followers(self, task: int, timeout_s: float) -> tuple[int, list[KVTransferError]]:
        try:
            answers = self._executor.wait(task, timeout_s)
        except RankTaskFailed as e:
            return 0, [KVTransferError(f"a tensor-parallel rank's share of the read: {e}",
                                       "timeout" if e.timed_out else "failed")]
        errors = [KVTransferError(failure[1], failure[0]) for _, failure in answers if failure]
        return sum(n for n, _ in answers), errors

    def take_notifications(self) -> list[bytes]:
        return self._inner.take_notifications()

    def close(self) -> None:
        self._inner.close()
