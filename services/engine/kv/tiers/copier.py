"""The copy worker: one thread that moves blocks between the device cache and the tiers, off the
engine thread.

It takes every job queued since its last round at once, so the blocks a step freed go to host
memory in one gather and one scatter rather than a copy each; on a GPU it copies on its own stream
into the pinned pool (DMA). Blocks the host tier evicts to make room are written to disk after the
round's copies, outside the lock. A device block being read or written here is never touched by
the engine meanwhile: a stored block is held from reuse (TierManager.before_reuse), a loading
request's blocks are its own and it is not scheduled until its load ends. With an EAGLE head each
copy runs over the head's cache too (TierManager.views, HostTier.pools), in the same round.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from baton.services.engine.kv.tiers.jobs import Flush, Load, Store
from baton.services.engine.kv.tiers.replicas import TierLoads, TierStores
from baton.services.engine.kv.tiers.slots import copy_payloads, load_slots, store_slots

if TYPE_CHECKING:
    from baton.services.engine.kv.tiers.manager import TierManager

log = logging.getLogger(__name__)


class CopyWorker(threading.Thread):

    def __init__(self, tiers: "TierManager") -> None:
        super().__init__(name="kv-tier-copier", daemon=True)
        self.tiers = tiers
        view = tiers.device_view
        self.stream = torch.cuda.Stream(view.device) if view.is_cuda else None

    def run(self) -> None:
        while True:
            jobs = [self.tiers.jobs.get()]
            try:
                while True:
                    jobs.append(self.tiers.jobs.get_nowait())
            except queue.Empty:
                pass
            stores = [j for j in jobs if isinstance(j, Store)]
            if stores:
                self._guarded(self._store, stores)
            for job in jobs:
                if isinstance(job, Load):
                    self._guarded(self._load, job)
            for job in jobs:
                if isinstance(job, Flush):
                    self._guarded(self._flush, job)
            if None in jobs:
                return

    def _guarded(self, fn: Callable[[Any], None], job: list[Store] | Load | Flush) -> None:
        """A failed copy must not kill the thread (the engine would wait on it forever): the
        store is dropped, the load ends with what it had."""
        try:
            fn(job)
        except Exception:  # noqa: BLE001 - logged, and the job ends as below
            log.exception("KV tier copy failed")
            self._finish_stores(job if isinstance(job, list) else [], [])
            if isinstance(job, Load):
                self._finish_load(job)
            if isinstance(job, Flush):
                job.done.set()

    def _flush(self, job: Flush) -> None:
        """Under tensor parallelism, once the other ranks have done their disk writes too."""
        mirror = self.tiers.disk_mirror
        if mirror is not None:
            mirror.answer(mirror.ask([]))
        job.done.set()

    def _store(self, stores: list[Store]) -> None:
        """In rounds of at most the host tier's size, so that a round larger than the tier pushes
        the blocks of the one before on to disk rather than being cut short."""
        step = max(1, self.tiers.host.capacity)
        for i in range(0, len(stores), step):
            self._store_round(stores[i:i + step])

    def _store_round(self, stores: list[Store]) -> None:
        tiers, host = self.tiers, self.tiers.host
        plan: list[tuple[Store, int]] = []
        evicted: list[tuple[int, int, bytes]] = []  # (host slot, block hash, its bytes)
        with tiers.lock:
            for s in stores:
                if s.block_hash in host:
                    continue
                got = host.take_slot()
                if got is None:
                    continue
                slot, old = got
                if old is not None:
                    tiers.record("removed", old, "host")
                if old is not None and tiers.disk is not None:
                    evicted.append((slot, old, host.slot_bytes(slot)))
                plan.append((s, slot))
        started = time.perf_counter()
        if plan and tiers.replicas is not None:
            # Before the blocks can be reused (see replicas.py): the other ranks copy theirs too.
            tiers.replicas.send(TierStores([(s.block, slot) for s, slot in plan],
                                           [(slot, h) for slot, h, _ in evicted]))
        if plan:
            with self._on_stream():
                pairs = [(s.block, slot) for s, slot in plan]
                for view, pool in zip(tiers.views, host.pools):
                    store_slots(view, pool, pairs)
                self._sync()
        stats = tiers.stats["host"]
        stats.seconds_stored += time.perf_counter() - started
        stats.blocks_stored += len(plan)
        stats.bytes_stored += len(plan) * host.block_bytes
        self._finish_stores(stores, plan)
        for _, block_hash, payload in evicted:
            self._write_disk(block_hash, payload)
        if tiers.disk_mirror is not None:
            tiers.disk_mirror.flush()

    def _finish_stores(self, stores: list[Store], plan: list[tuple[Store, int]]) -> None:
        tiers = self.tiers
        with tiers.lock:
            for s, slot in plan:
                tiers.host.put(s.block_hash, slot)
                tiers.record("stored", s.block_hash, "host")
            for s in stores:
                tiers.storing.pop(s.block, None)
                tiers.storing_hashes.discard(s.block_hash)
            tiers.lock.notify_all()

    def _write_disk(self, block_hash: int, payload: bytes) -> None:
        disk, stats = self.tiers.disk, self.tiers.stats["disk"]
        started = time.perf_counter()
        if disk.write(block_hash, payload):
            stats.seconds_stored += time.perf_counter() - started
            stats.blocks_stored += 1
            stats.bytes_stored += len(payload)

    def _load(self, job: Load) -> None:
        """Copies job's hits in order into its device blocks; a disk block that fails its read, on
        any rank (disk_replicas.py), ends the prefix there. job.loaded is set once every copy is
        done: a failure before leaves it 0, and the request computes every block."""
        mirror = self.tiers.disk_mirror
        on_disk = [i for i, hit in enumerate(job.hits) if hit.slot is None]
        asked = None
        if mirror is not None and on_disk:
            # The other ranks read their shares while this one reads its own.
            asked = mirror.ask([(job.hits[i].block_hash, job.dst_blocks[i]) for i in on_disk])
        try:
            ready, disk_seconds, host_seconds = self._copy_in(job)
        finally:  # even after a failure here: the others' copies must end before the request runs
            asking = time.perf_counter()
            landed = len(on_disk) if asked is None else mirror.answer(asked)
        disk_seconds += time.perf_counter() - asking
        if landed < len(on_disk):  # another rank's share of this block failed its read
            failed = on_disk[landed]
            self.tiers.disk.discard(job.hits[failed].block_hash)
            if failed != ready:  # unless refused here too, and counted then
                self.tiers.stats["disk"].checksum_failures += 1
            ready = min(ready, failed)
        if mirror is not None:
            mirror.flush()  # the blocks dropped, on every rank
        disk_blocks = sum(1 for hit in job.hits[:ready] if hit.slot is None)
        self._count_load("disk", disk_blocks, disk_seconds)
        self._count_load("host", ready - disk_blocks, host_seconds)
        job.loaded = ready
        self._finish_load(job)

    def _copy_in(self, job: Load) -> tuple[int, float, float]:
        """This rank's copies: how many leading blocks are in place, and the seconds spent on the
        disk ones and on the host ones."""
        tiers = self.tiers
        host_pairs: list[tuple[int, int]] = []  # (slot, device block)
        ready = 0
        started = time.perf_counter()
        with self._on_stream():
            for hit, block in zip(job.hits, job.dst_blocks):
                if hit.slot is not None:
                    host_pairs.append((hit.slot, block))
                else:
                    payload = tiers.disk.read(hit.block_hash)
                    if payload is None:
                        break
                    copy_payloads(tiers.views, block, payload)
                ready += 1
            disk_done = time.perf_counter()
            if host_pairs and tiers.replicas is not None:
                # Before the load is done and its request runs (see replicas.py).
                tiers.replicas.send(TierLoads(host_pairs))
            if host_pairs:
                for view, pool in zip(tiers.views, tiers.host.pools):
                    load_slots(view, pool, host_pairs)
            self._sync()
        return ready, disk_done - started, time.perf_counter() - disk_done

    def _sync(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def _count_load(self, tier: str, blocks: int, seconds: float) -> None:
        if blocks:
            stats = self.tiers.stats[tier]
            stats.blocks_loaded += blocks
            stats.bytes_loaded += blocks * self.tiers.host.block_bytes
            stats.seconds_loaded += seconds

    def _finish_load(self, job: Load) -> None:
        tiers = self.tiers
        with tiers.lock:
            for hit in job.hits:
                if hit.slot is not None:
                    tiers.host.unpin(hit.slot)
            job.done = True
            tiers.finished.append(job)
            tiers.lock.notify_all()

    def _on_stream(self) -> contextlib.AbstractContextManager:
        """The copier's own CUDA stream, so copies overlap the engine's kernels; nothing on CPU."""
        if self.stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.stream)
