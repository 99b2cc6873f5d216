"""The disk tier under tensor parallelism: each rank keeps its own heads' share of every block in
files of its own, under <dir>/tp-<size>/rank-<rank>/ on its own node (the setting names the same
path on every node), so that a share is only ever read back by the rank and group size that wrote
it.

As for the host tier (replicas.py), rank 0 decides: which blocks its DiskTier writes, evicts and
reads. Its copy worker sends the other ranks what its tier did (TierDiskOps), and each follower's
DiskShare does the same to its files, on a thread of its own so that file I/O never holds up a
step. A block written to disk comes from a host slot the same round's TierStores reuses, so the
follower stages the slots' bytes (TierStores.evicted) before that copy, as rank 0 does.

A load is checked on every rank, since a follower's file may be missing, torn or corrupt where
rank 0's holds: rank 0 asks the followers to read their shares (TierDiskLoad) before it reads
its own, each answers how many leading blocks landed, and the load's prefix ends at the first
block that failed on any rank (dropped there on every rank), as a failed read ends it at TP=1. A
rank that fails to answer fails the whole load's disk part. Rank 0 waits for every answer however
long it takes: a copy still running after the request went on would overwrite the KV it computed.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from baton.services.engine.kv.layout import byte_view, order_of
from baton.services.engine.kv.tiers.disk import DiskTier
from baton.services.engine.kv.tiers.slots import copy_payload
from baton.services.engine.kv.tiers.stats import TierStats
from baton.services.engine.parallel.rank_tasks import RankTaskFailed

log = logging.getLogger(__name__)

# Replies.wait's bound when rank 0 must wait for an answer however long it takes (a dead rank is
# noticed at once by the executor's watcher, which stops the worker).
NO_TIMEOUT_S = threading.TIMEOUT_MAX / 2


def share_dir(root: str | Path, rank: int, size: int) -> Path:
    return Path(root) / f"tp-{size}" / f"rank-{rank}"


@dataclass(frozen=True)
class TierDiskStart:
    """Open this rank's share of the disk tier, keeping only the files of these blocks (rank 0's
    after its start) and deleting the others."""
    directory: str  # the setting: the same path on every node
    capacity_bytes: int
    keep: list[int]


@dataclass(frozen=True)
class TierDiskOps:
    """What rank 0's disk tier did, in order: (True, hash) wrote the block (its bytes staged from
    the last TierStores), (False, hash) dropped it."""
    ops: list[tuple[bool, int]]


@dataclass
class TierDiskLoad:
    """Read each (block hash, device block) pair's file into its block, in order, stopping at the
    first that fails; answer how many landed. Without pairs: answer once every earlier disk
    message is done (a flush)."""
    pairs: list[tuple[int, int]]
    task_id: int = 0  # set by the executor's post


class Replicas(Protocol):
    """The other ranks as rank 0's tiers reach them: the executor (parallel/executor.py)."""
    size: int

    def send(self, message: Any) -> None: ...

    def post(self, task: Any) -> int: ...

    def wait(self, task_id: int, timeout_s: float) -> list[Any]: ...


class DiskMirror:
    """Rank 0's side: what its disk tier did, sent on; the followers' loads, asked and agreed."""

    def __init__(self, replicas: Replicas, root: str, capacity_bytes: int,
                 keep: list[int]) -> None:
        self.replicas = replicas
        self.ops: list[tuple[bool, int]] = []  # not sent yet (the copy worker's thread only)
        replicas.send(TierDiskStart(root, capacity_bytes, keep))

    def record(self, kind: str, block_hash: int) -> None:
        self.ops.append((kind == "stored", block_hash))

    def flush(self) -> None:
        if self.ops:
            self.replicas.send(TierDiskOps(self.ops))
            self.ops = []

    def ask(self, pairs: list[tuple[int, int]]) -> int:
        """Sends a load (after every op so far, which it must follow); returns its task id."""
        self.flush()
        return self.replicas.post(TierDiskLoad(pairs))

    def answer(self, task_id: int) -> int:
        """The leading blocks of an asked load that landed on every other rank; 0 if one failed."""
        try:
            return min(self.replicas.wait(task_id, NO_TIMEOUT_S))
        except RankTaskFailed as e:
            log.warning("KV disk tier: a load failed on another rank (%s); its blocks are "
                        "recomputed", e)
            return 0


# (task id, value, error): the follower's answer to a TierDiskLoad, sent up rank 0's channel.
Reply = Callable[[int, Any, str | None], None]


class DiskShare(threading.Thread):
    """A rank other than 0: its share of the disk tier, as rank 0's messages say, in their order."""

    def __init__(self, kv_cache: torch.Tensor, start: TierDiskStart, rank: int, size: int,
                 reply: Reply) -> None:
        super().__init__(name="kv-tier-disk", daemon=True)
        view = self.view = byte_view(kv_cache)  # [layers, blocks, block_nbytes]
        layers, _, nbytes = view.shape
        self.disk = DiskTier(share_dir(start.directory, rank, size), start.capacity_bytes,
                             layers * nbytes, TierStats(), order=order_of(kv_cache))
        keep = set(start.keep)
        for block_hash in [h for h in self.disk.index if h not in keep]:
            self.disk.discard(block_hash)
        self.reply = reply
        self.staged: dict[int, bytes] = {}  # the last store round's evicted slots, by hash
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.stream = torch.cuda.Stream(view.device) if view.is_cuda else None
        self.start()

    def stage(self, payloads: dict[int, bytes]) -> None:
        self.queue.put(payloads)

    def put(self, message: TierDiskOps | TierDiskLoad) -> None:
        self.queue.put(message)

    def close(self) -> None:
        """Finishes what was sent (writes included) and stops."""
        self.queue.put(None)
        self.join()

    def run(self) -> None:
        while (item := self.queue.get()) is not None:
            if isinstance(item, dict):
                self.staged = item
            elif isinstance(item, TierDiskOps):
                self._apply(item)
            else:
                self._answer(item)

    def _apply(self, message: TierDiskOps) -> None:
        for stored, block_hash in message.ops:
            if not stored:
                self.disk.discard(block_hash)
            elif (payload := self.staged.pop(block_hash, None)) is not None:
                # A failed write leaves the file missing: rank 0 learns it when a load fails.
                self.disk.write(block_hash, payload)

    def _answer(self, message: TierDiskLoad) -> None:
        try:
            landed = self._read(message.pairs)
        except Exception as e:  # noqa: BLE001 - rank 0 fails the load and goes on
            log.exception("KV disk tier: a load failed")
            self.reply(message.task_id, None, str(e) or repr(e))
            return
        self.reply(message.task_id, landed, None)

    def _read(self, pairs: list[tuple[int, int]]) -> int:
        landed = 0
        on_stream = (contextlib.nullcontext() if self.stream is None else
                     torch.cuda.stream(self.stream))
        with on_stream:
            for block_hash, block in pairs:
                payload = self.disk.read(block_hash)
                if payload is None:
                    break
                copy_payload(self.view, block, payload)
                landed += 1
            if self.stream is not None:
                self.stream.synchronize()
        return landed
