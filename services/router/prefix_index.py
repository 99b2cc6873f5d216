"""Global prefix index: block hash -> workers holding that block, and per prompt the leading blocks each has.

Two sources feed it, chosen per worker:
- exact: the worker's own KV events (stored/removed/cleared), applied in sequence order. A sequence gap, or a batch
  flagged `gap`, means events were lost; the worker's entries are then kept as they were (mostly right, and better
  than nothing) and further events are ignored until a snapshot replaces them.
- approximate: what this router placed where, for workers whose events are unavailable. Entries expire after a TTL
  and each worker keeps at most a bounded number (least recently routed dropped first), because the router cannot
  see the worker's evictions and must not believe in blocks that are long gone.

Hashes come from baton.services.engine.block_hash (the caller computes them with the tenant's salt), so the index
only ever compares opaque 64-bit keys.
"""
from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


class EventKind(enum.IntEnum):
    """Numbered as baton.v1.KVEvent.Kind."""
    STORED = 1
    REMOVED = 2
    CLEARED = 3


@dataclass
class _ExactState:
    last_sequence: int = 0
    needs_resync: bool = False
    hashes: set[int] = field(default_factory=set)


class PrefixIndex:
    def __init__(self, approx_ttl_s: float, approx_max_blocks_per_worker: int,
                 clock: Callable[[], float]) -> None:
        self.approx_ttl_s = approx_ttl_s
        self.approx_max_blocks_per_worker = approx_max_blocks_per_worker
        self._clock = clock
        self._exact: dict[str, _ExactState] = {}
        self._exact_holders: dict[int, set[str]] = {}
        # Per worker: hash -> time it was last routed there, least recent first.
        self._approx: dict[str, OrderedDict[int, float]] = {}
        self._approx_holders: dict[int, set[str]] = {}
        self._approx_mode: set[str] = set()

    # -- exact source -------------------------------------------------------------------------------------------

    def apply_events(self, worker_id: str, events: Iterable[Any], gap: bool = False) -> bool:
        """Folds a batch of baton.v1.KVEvent (or look-alikes) in; returns False when the worker needs a snapshot."""
        state = self._exact.setdefault(worker_id, _ExactState())
        if gap:
            state.needs_resync = True
        for event in sorted(events, key=lambda e: e.sequence):
            if state.needs_resync:
                break
            if event.sequence <= state.last_sequence:
                continue  # already applied (a replayed batch after a reconnect)
            if event.sequence != state.last_sequence + 1:
                state.needs_resync = True
                break
            self._apply_one(worker_id, state, EventKind(event.kind), event.block_hashes)
            state.last_sequence = event.sequence
        return not state.needs_resync

    def _apply_one(self, worker_id: str, state: _ExactState, kind: EventKind, hashes: Sequence[int]) -> None:
        if kind is EventKind.STORED:
            for h in hashes:
                state.hashes.add(h)
                self._exact_holders.setdefault(h, set()).add(worker_id)
        elif kind is EventKind.REMOVED:
            for h in hashes:
                state.hashes.discard(h)
                _discard_holder(self._exact_holders, h, worker_id)
        else:
            self._drop_exact_entries(worker_id, state)

    def apply_snapshot(self, worker_id: str, sequence: int, hashes: Iterable[int]) -> None:
        """Replaces the worker's entries with a baton.v1.KVSnapshot's; events after `sequence` apply next."""
        state = self._exact.setdefault(worker_id, _ExactState())
        self._drop_exact_entries(worker_id, state)
        for h in hashes:
            state.hashes.add(h)
            self._exact_holders.setdefault(h, set()).add(worker_id)
        state.last_sequence = sequence
        state.needs_resync = False

    def _drop_exact_entries(self, worker_id: str, state: _ExactState) -> None:
        for h in state.hashes:
            _discard_holder(self._exact_holders, h, worker_id)
        state.hashes.clear()

    def needs_resync(self, worker_id: str) -> bool:
        state = self._exact.get(worker_id)
        return state is not None and state.needs_resync

    def last_sequence(self, worker_id: str) -> int:
        """Where the worker's event stream should resume (`after_sequence`)."""
        state = self._exact.get(worker_id)
        return 0 if state is None else state.last_sequence

    # -- approximate source -------------------------------------------------------------------------------------

    def set_events_available(self, worker_id: str, available: bool) -> None:
        """Workers without a live event stream are answered from this router's placements instead."""
        if available:
            self._approx_mode.discard(worker_id)
        else:
            self._approx_mode.add(worker_id)

    def record_placement(self, worker_id: str, hashes: Sequence[int]) -> None:
        """The blocks of a prompt just routed to the worker, which will hold them once it has run the prefill."""
        now = self._clock()
        entries = self._approx.setdefault(worker_id, OrderedDict())
        for h in hashes:
            if h in entries:
                entries.move_to_end(h)
            else:
                self._approx_holders.setdefault(h, set()).add(worker_id)
            entries[h] = now
        while len(entries) > self.approx_max_blocks_per_worker:
            h, _ = entries.popitem(last=False)
            _discard_holder(self._approx_holders, h, worker_id)

    def _expire_approx(self, now: float) -> None:
        cutoff = now - self.approx_ttl_s
        for worker_id, entries in self._approx.items():
            while entries:
                h, touched = next(iter(entries.items()))
                if touched > cutoff:
                    break
                entries.popitem(last=False)
                _discard_holder(self._approx_holders, h, worker_id)

    # -- membership and query -----------------------------------------------------------------------------------

    def remove_worker(self, worker_id: str) -> None:
        state = self._exact.pop(worker_id, None)
        if state is not None:
            self._drop_exact_entries(worker_id, state)
        for h in self._approx.pop(worker_id, OrderedDict()):
            _discard_holder(self._approx_holders, h, worker_id)
        self._approx_mode.discard(worker_id)

    def _holders(self, h: int) -> set[str]:
        exact = self._exact_holders.get(h, _EMPTY)
        if not self._approx_mode:
            return exact
        approx = self._approx_holders.get(h, _EMPTY) & self._approx_mode
        return (exact - self._approx_mode) | approx

    def match_lengths(self, hashes: Sequence[int]) -> dict[str, int]:
        """For each worker holding the first block: how many leading blocks of `hashes` it holds."""
        if self._approx_mode:
            self._expire_approx(self._clock())
        if not hashes:
            return {}
        # Set intersections run in C; Python only touches a worker when its run of hits ends.
        alive = set(self._holders(hashes[0]))
        matched: dict[str, int] = {}
        for i in range(1, len(hashes)):
            if not alive:
                break
            still = alive & self._holders(hashes[i])
            for worker_id in alive - still:
                matched[worker_id] = i
            alive = still
        for worker_id in alive:
            matched[worker_id] = len(hashes)
        return matched


_EMPTY: frozenset = frozenset()


def _discard_holder(holders: dict[int, set[str]], h: int, worker_id: str) -> None:
    workers = holders.get(h)
    if workers is not None:
        workers.discard(worker_id)
        if not workers:
            del holders[h]
