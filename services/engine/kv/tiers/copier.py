"""The copy worker: one thread that moves blocks between the device cache and the tiers, off the
engine thread.

It takes every job queued since its last round at once, so the blocks a step freed go to host
memory in one gather and one scatter rather than a copy each; on a GPU it copies on its own stream
into the pinned pool (DMA). Blocks the host tier evicts to make room are written to disk after the
round's copies, outside the lock. A device block being read or written here is never touched by
the engine meanwhile: a stored block is held from reuse (TierManager.before_reuse), a loading
request's blocks are its own and it is not scheduled until its load ends.
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

from baton.services.engine.kv.layout import block_runs
from baton.services.engine.kv.tiers.jobs import Flush, Load, Store

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
                    job.done.set()
            if None in jobs:
                return

    def _guarded(self, fn: Callable[[Any], None], job: list[Store] | Load) -> None:
        """A failed copy must not kill the thread (the engine would wait on it forever): the
        store is dropped, the load ends with what it had."""
        try:
            fn(job)
        except Exception:  # noqa: BLE001 - logged, and the job ends as below
            log.exception("KV tier copy failed")
            self._finish_stores(job if isinstance(job, list) else [], [])
            if isinstance(job, Load):
                self._finish_load(job)

    def _store(self, stores: list[Store]) -> None:
        """In rounds of at most the host tier's size, so that a round larger than the tier pushes
        the blocks of the one before on to disk rather than being cut short."""
        step = max(1, self.tiers.host.capacity)
        for i in range(0, len(stores), step):
            self._store_round(stores[i:i + step])

    def _store_round(self, stores: list[Store]) -> None:
        tiers, host = self.tiers, self.tiers.host
        plan: list[tuple[Store, int]] = []
        evicted: list[tuple[int, bytes]] = []
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
                    evicted.append((old, host.pool[slot].numpy().tobytes()))
                plan.append((s, slot))
        started = time.perf_counter()
        if plan:
            blocks = torch.tensor([s.block for s, _ in plan], device=tiers.device_view.device)
            with self._on_stream():
                gathered = tiers.device_view.index_select(1, blocks).transpose(0, 1).contiguous()
                for slot, first, count in block_runs([slot for _, slot in plan],
                                                     list(range(len(plan)))):
                    host.pool[slot:slot + count].copy_(gathered[first:first + count],
                                                       non_blocking=True)
                self._sync()
        stats = tiers.stats["host"]
        stats.seconds_stored += time.perf_counter() - started
        stats.blocks_stored += len(plan)
        stats.bytes_stored += len(plan) * host.block_bytes
        self._finish_stores(stores, plan)
        for block_hash, payload in evicted:
            self._write_disk(block_hash, payload)

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
        """Copies job's hits in order into its device blocks; a disk block that fails its read ends
        the prefix there."""
        tiers = self.tiers
        view = tiers.device_view
        host_pairs: list[tuple[int, int]] = []  # (slot, device block)
        started = time.perf_counter()
        disk_blocks = 0
        with self._on_stream():
            for hit, block in zip(job.hits, job.dst_blocks):
                if hit.slot is not None:
                    host_pairs.append((hit.slot, block))
                else:
                    payload = tiers.disk.read(hit.block_hash)
                    if payload is None:
                        break
                    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
                    view[:, block].copy_(data.view(view.shape[0], view.shape[2]))
                    disk_blocks += 1
                job.loaded += 1
            disk_done = time.perf_counter()
            if host_pairs:
                self._load_host(host_pairs)
            self._sync()
        self._count_load("disk", disk_blocks, disk_done - started)
        self._count_load("host", len(host_pairs), time.perf_counter() - disk_done)
        self._finish_load(job)

    def _load_host(self, pairs: list[tuple[int, int]]) -> None:
        """Pinned slots straight to a device buffer, one DMA per run of consecutive slots (a CPU
        gather first would copy from pageable memory at a fraction of the bus's speed), then one
        scatter into the cache's blocks."""
        view, pool = self.tiers.device_view, self.tiers.host.pool
        rows = torch.empty((len(pairs), *pool.shape[1:]), dtype=pool.dtype, device=view.device)
        for slot, first, count in block_runs([s for s, _ in pairs], list(range(len(pairs)))):
            rows[first:first + count].copy_(pool[slot:slot + count], non_blocking=True)
        blocks = torch.tensor([b for _, b in pairs], device=view.device)
        view.index_copy_(1, blocks, rows.transpose(0, 1))

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
