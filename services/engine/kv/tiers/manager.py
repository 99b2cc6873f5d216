"""TierManager: the tiers as the block manager and the scheduler see them (engine thread), over
the state the copy worker shares with it under one lock.

Engine-thread calls never wait on a copy, with one exception that should not happen in practice:
reusing a device block whose copy to host is still in flight (freed cached blocks are reused
last, so the copy has long finished by then).
"""
from __future__ import annotations

import queue
import threading

import torch

from baton.services.engine.kv.block_manager import Medium, MediumEvent
from baton.services.engine.kv.layout import byte_view, order_of
from baton.services.engine.kv.tiers.copier import CopyWorker
from baton.services.engine.kv.tiers.disk import DiskTier
from baton.services.engine.kv.tiers.disk_replicas import DiskMirror, Replicas, share_dir
from baton.services.engine.kv.tiers.host import HostTier
from baton.services.engine.kv.tiers.jobs import Flush, Load, Store, TierHit
from baton.services.engine.kv.tiers.replicas import TierPool
from baton.services.engine.kv.tiers.stats import TierStats

GIB = 1 << 30


class TierManager:

    def __init__(self, kv_cache: torch.Tensor, host_gib: float, disk_dir: str | None = None,
                 disk_gib: float = 0.0, replicas: Replicas | None = None,
                 head_cache: torch.Tensor | None = None) -> None:
        """replicas: under tensor parallelism, rank 0's line to the other ranks, whose tiers
        follow this one's copies (replicas.py, disk_replicas.py). head_cache: an EAGLE head's
        cache (kv_cache's block ids; rank 0's alone under tensor parallelism), whose blocks the
        tiers keep and bring back with the target's."""
        self.device_view = byte_view(kv_cache)  # [layers, blocks, block_nbytes]
        self.head_view = None if head_cache is None else byte_view(head_cache)
        layers, _, nbytes = self.device_view.shape
        self.block_size = kv_cache.shape[3]
        self.stats = {"host": TierStats(), "disk": TierStats()}
        head = None if self.head_view is None else (self.head_view.shape[0],
                                                    self.head_view.shape[2])
        block_bytes = layers * nbytes + (0 if head is None else head[0] * head[1])
        self.host = HostTier(int(host_gib * GIB) // block_bytes, layers, nbytes,
                             pin=kv_cache.is_cuda, head=head)
        self.replicas = replicas
        if replicas is not None:
            replicas.send(TierPool(self.host.capacity))
        self.lock = threading.Condition()  # reentrant: the disk tier records under it too
        # With record_events (a worker whose router mirrors its cache), each block that enters or
        # leaves a tier is logged here, under the lock, for the engine to drain with its own.
        self.record_events = False
        self.events: list[MediumEvent] = []
        self.disk: DiskTier | None = None
        self.disk_mirror: DiskMirror | None = None
        if disk_dir is not None:
            own = disk_dir if replicas is None else share_dir(disk_dir, 0, replicas.size)
            self.disk = DiskTier(own, int(disk_gib * GIB), block_bytes, self.stats["disk"],
                                 self.record, order_of(kv_cache), head is not None)
            if replicas is not None:
                self.disk_mirror = DiskMirror(replicas, disk_dir, int(disk_gib * GIB),
                                              list(self.disk.index))
        self.storing: dict[int, int] = {}  # device block -> hash, copy to host queued or running
        self.storing_hashes: set[int] = set()
        self.finished: list[Load] = []
        self.jobs: queue.SimpleQueue[Store | Load | Flush | None] = queue.SimpleQueue()
        self.worker = CopyWorker(self)
        self.worker.start()

    @property
    def views(self) -> list[torch.Tensor]:
        """The device caches whose blocks the tiers hold, in HostTier.pools' order."""
        return [self.device_view] if self.head_view is None else [self.device_view,
                                                                   self.head_view]

    def record(self, kind: str, block_hash: int, medium: Medium) -> None:
        """A block entered ("stored") or left ("removed") a tier."""
        if medium == "disk" and self.disk_mirror is not None:
            self.disk_mirror.record(kind, block_hash)
        if self.record_events:
            with self.lock:
                self.events.append((kind, block_hash, medium))

    def drain_events(self) -> list[MediumEvent]:
        with self.lock:
            events, self.events = self.events, []
        return events

    def block_hashes(self) -> dict[Medium, list[int]]:
        """Every block hash each tier holds now."""
        with self.lock:
            host = list(self.host.index)
        return {"host": host, "disk": [] if self.disk is None else self._disk_hashes()}

    def _disk_hashes(self) -> list[int]:
        """The copy worker adds files outside the lock (disk writes must not stall lookups), so a
        read racing one is retried."""
        while True:
            try:
                return list(self.disk.index)
            except RuntimeError:  # the index changed while it was read
                continue

    def load_seconds_per_block(self) -> dict[Medium, float]:
        """Measured cost of loading one block from each tier: its loads' mean, or before any, its
        stores' (the same bytes the other way); 0 when nothing was measured."""
        out: dict[Medium, float] = {}
        for tier, s in self.stats.items():
            out[tier] = (s.seconds_loaded / s.blocks_loaded if s.blocks_loaded else
                         s.seconds_stored / s.blocks_stored if s.blocks_stored else 0.0)
        return out

    # -- the block manager's hooks

    def store(self, block: int, block_hash: int) -> None:
        """A cached device block lost its last user: copy it to the host tier unless it is there
        already."""
        with self.lock:
            if block_hash in self.storing_hashes or self.host.get(block_hash) is not None:
                return
            self.storing[block] = block_hash
            self.storing_hashes.add(block_hash)
        self.jobs.put(Store(block, block_hash))

    def before_reuse(self, block: int) -> None:
        """Holds a device block's reuse until its copy to host has read it."""
        with self.lock:
            self.lock.wait_for(lambda: block not in self.storing)

    # -- the scheduler's

    def lookup(self, hashes: list[int]) -> list[TierHit]:
        """The longest run of hashes, from the first, found in the host tier or on disk; host
        slots found are pinned until released or loaded."""
        hits = []
        with self.lock:
            for h in hashes:
                slot = self.host.get(h)
                if slot is not None:
                    self.host.pin(slot)
                elif self.disk is None or h not in self.disk:
                    break
                hits.append(TierHit(h, slot))
        return hits

    def release(self, hits: list[TierHit]) -> None:
        """Unpins the slots of a lookup that will not be loaded."""
        with self.lock:
            for hit in hits:
                if hit.slot is not None:
                    self.host.unpin(hit.slot)

    def count(self, queried_tokens: int, hits: list[TierHit]) -> None:
        """One admitted request's lookup: queried_tokens the device cache missed."""
        host_hits = sum(1 for h in hits if h.slot is not None) * self.block_size
        disk_hits = len(hits) * self.block_size - host_hits
        self.stats["host"].queries += queried_tokens
        self.stats["host"].hits += host_hits
        if self.disk is not None:
            self.stats["disk"].queries += queried_tokens - host_hits
            self.stats["disk"].hits += disk_hits

    def load(self, hits: list[TierHit], dst_blocks: list[int]) -> Load:
        job = Load(hits, dst_blocks)
        self.jobs.put(job)
        return job

    def poll(self) -> list[Load]:
        """Loads finished since the last poll."""
        with self.lock:
            done, self.finished = self.finished, []
        return done

    def wait_for_load(self, timeout: float) -> None:
        with self.lock:
            self.lock.wait_for(lambda: bool(self.finished), timeout)

    def wait(self, job: Load) -> None:
        with self.lock:
            self.lock.wait_for(lambda: job.done)
            if job in self.finished:
                self.finished.remove(job)

    def usage(self) -> dict[str, tuple[int, int]]:
        """(bytes used, bytes allowed) per tier."""
        out = {"host": (self.host.bytes_used, self.host.capacity * self.host.block_bytes)}
        if self.disk is not None:
            out["disk"] = (self.disk.bytes_used, self.disk.capacity * self.disk.file_bytes)
        return out

    def flush(self, timeout: float = 120.0) -> bool:
        """Waits until every copy queued so far is done (blocks evicted from host on disk too)."""
        job = Flush()
        self.jobs.put(job)
        return job.done.wait(timeout)

    def close(self) -> None:
        self.jobs.put(None)
        self.worker.join()
