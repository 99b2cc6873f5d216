"""Global prefix index: block hash -> workers holding that block, and per prompt the leading blocks
each has.

Two sources feed it, chosen per worker:
- exact: the worker's own KV events (stored/removed/cleared), applied in sequence order. A sequence
  gap, or a batch flagged `gap`, means events were lost; the worker's entries are then kept as they
  were (mostly right, and better than nothing) and further events are ignored until a snapshot
  replaces them.
- approximate: what this router placed where, for workers whose events are unavailable. Entries
  expire after a TTL and each worker keeps at most a bounded number (least recently routed dropped
  first), because the router cannot see the worker's evictions and must not believe in blocks that
  are long gone.

Placements onto a worker whose events are live only go to a bounded journal (one array per
placement): its entries would not be consulted, and keeping them indexed cost most of a decision.
Should the stream drop, the journal is replayed into the approximate index, so the worker is
answered as if its placements had been recorded all along.

Each hash's holders are an int bitmask over worker slots rather than a set of ids: millions of small
sets made every full garbage collection walk them all (pauses of hundreds of milliseconds), and ints
are not GC-tracked.

Events and snapshots also say which blocks a worker holds in its KV tiers (host memory, local
disk: the event's medium). Those are kept per worker, apart from the device holders: match_lengths
answers from the device caches as before, and tier_runs says how far each worker's run of leading
blocks goes on in its tiers past its device run (a worker loads tier blocks only to continue a
device prefix, kv/tiers), which the scorers value by measured load cost (tier_value.py).

Hashes come from baton.services.common.block_hash (the caller computes them with the tenant's salt),
so the index only ever compares opaque 64-bit keys.
"""
from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from baton.services.common.messages.worker import EventKind, KVEvent, Medium


@dataclass
class _ExactState:
    last_sequence: int = 0
    needs_resync: bool = False
    hashes: set[int] = field(default_factory=set)  # in the device cache
    host: set[int] = field(default_factory=set)  # in the host-memory tier
    disk: set[int] = field(default_factory=set)  # in the local-disk tier

    def tier(self, medium: Medium) -> set[int]:
        return self.host if medium is Medium.HOST else self.disk


@dataclass(frozen=True)
class TierRun:
    """Leading blocks a worker holds in its KV tiers right after its device-cache run."""
    host: int = 0
    disk: int = 0


class _Journal:
    """Recent placements onto a worker with live events, oldest first, holding about as many blocks
    as its approximate entries may (a hash routed twice counts twice, so a replay can hold slightly
    fewer)."""

    def __init__(self) -> None:
        self.placements: deque[tuple[float, array]] = deque()
        self.blocks = 0

    def append(self, now: float, hashes: Sequence[int], max_blocks: int, cutoff: float) -> None:
        self.placements.append((now, array("Q", hashes)))
        self.blocks += len(hashes)
        placements = self.placements
        while len(placements) > 1:
            touched, oldest = placements[0]
            if touched > cutoff and self.blocks - len(oldest) < max_blocks:
                break
            placements.popleft()
            self.blocks -= len(oldest)


class _Slots:
    """Worker id <-> bit position in the holder masks; freed positions are reused so masks stay
    small."""

    def __init__(self) -> None:
        self._bits: dict[str, int] = {}
        self.ids: list[str | None] = []
        self._free: list[int] = []

    def bit(self, worker_id: str) -> int:
        bit = self._bits.get(worker_id)
        if bit is None:
            if self._free:
                slot = self._free.pop()
                self.ids[slot] = worker_id
            else:
                slot = len(self.ids)
                self.ids.append(worker_id)
            bit = self._bits[worker_id] = 1 << slot
        return bit

    def release(self, worker_id: str) -> None:
        bit = self._bits.pop(worker_id, None)
        if bit is not None:
            slot = bit.bit_length() - 1
            self.ids[slot] = None
            self._free.append(slot)


def _set_bit(holders: dict[int, int], hashes: Iterable[int], bit: int) -> None:
    get = holders.get
    for h in hashes:
        holders[h] = get(h, 0) | bit


def _clear_bit(holders: dict[int, int], hashes: Iterable[int], bit: int) -> None:
    for h in hashes:
        mask = holders.get(h, 0) & ~bit
        if mask:
            holders[h] = mask
        else:
            holders.pop(h, None)


class PrefixIndex:
    def __init__(self, approx_ttl_s: float, approx_max_blocks_per_worker: int,
                 clock: Callable[[], float]) -> None:
        self.approx_ttl_s = approx_ttl_s
        self.approx_max_blocks_per_worker = approx_max_blocks_per_worker
        self._clock = clock
        self._slots = _Slots()
        self._exact: dict[str, _ExactState] = {}
        self._exact_holders: dict[int, int] = {}
        # Per worker: hash -> time it was last routed there, least recent first. Only workers in
        # approximate mode have their bits in _approx_holders; the others keep their entries for
        # when their events stop again.
        self._approx: dict[str, OrderedDict[int, float]] = {}
        self._approx_holders: dict[int, int] = {}
        self._approx_mask = 0  # bits of the workers answered from placements
        self._journals: dict[str, _Journal] = {}

    # -- exact source ------------------------------------------------------------------------------

    def apply_events(self, worker_id: str, events: Iterable[KVEvent], gap: bool = False) -> bool:
        """Folds a batch of a worker's block events in; returns False when the worker needs a
        snapshot."""
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
            if event.medium is Medium.DEVICE or event.kind is EventKind.CLEARED:
                self._apply_one(worker_id, state, event.kind, event.block_hashes)
            elif event.kind is EventKind.STORED:
                state.tier(event.medium).update(event.block_hashes)
            else:
                state.tier(event.medium).difference_update(event.block_hashes)
            state.last_sequence = event.sequence
        return not state.needs_resync

    def _apply_one(self, worker_id: str, state: _ExactState, kind: EventKind,
                   hashes: Sequence[int]) -> None:
        bit = self._slots.bit(worker_id)
        if kind is EventKind.STORED:
            state.hashes.update(hashes)
            _set_bit(self._exact_holders, hashes, bit)
        elif kind is EventKind.REMOVED:
            state.hashes.difference_update(hashes)
            _clear_bit(self._exact_holders, hashes, bit)
        else:
            self._drop_exact_entries(worker_id, state)

    def apply_snapshot(self, worker_id: str, sequence: int, hashes: Iterable[int],
                       host: Iterable[int] = (), disk: Iterable[int] = ()) -> None:
        """Replaces the worker's entries (device cache, and host and disk tiers) with a snapshot's;
        events after `sequence` apply next."""
        state = self._exact.setdefault(worker_id, _ExactState())
        self._drop_exact_entries(worker_id, state)
        state.hashes.update(hashes)
        state.host.update(host)
        state.disk.update(disk)
        _set_bit(self._exact_holders, state.hashes, self._slots.bit(worker_id))
        state.last_sequence = sequence
        state.needs_resync = False

    def _drop_exact_entries(self, worker_id: str, state: _ExactState) -> None:
        _clear_bit(self._exact_holders, state.hashes, self._slots.bit(worker_id))
        state.hashes.clear()
        state.host.clear()
        state.disk.clear()

    def needs_resync(self, worker_id: str) -> bool:
        state = self._exact.get(worker_id)
        return state is not None and state.needs_resync

    def last_sequence(self, worker_id: str) -> int:
        """Where the worker's event stream should resume (`after_sequence`)."""
        state = self._exact.get(worker_id)
        return 0 if state is None else state.last_sequence

    # -- approximate source ------------------------------------------------------------------------

    def set_events_available(self, worker_id: str, available: bool) -> None:
        """Workers without a live event stream are answered from this router's placements
        instead."""
        bit = self._slots.bit(worker_id)
        in_approx = bool(self._approx_mask & bit)
        if available and in_approx:
            self._approx_mask &= ~bit
            _clear_bit(self._approx_holders, self._approx.get(worker_id, ()), bit)
        elif not available and not in_approx:
            self._approx_mask |= bit
            _set_bit(self._approx_holders, self._approx.get(worker_id, ()), bit)
            journal = self._journals.pop(worker_id, None)
            for touched, hashes in journal.placements if journal is not None else ():
                self._record_approx(worker_id, bit, hashes, touched)

    def record_placement(self, worker_id: str, hashes: Sequence[int]) -> None:
        """The blocks of a prompt just routed to the worker, which will hold them once it has run
        the prefill."""
        now = self._clock()
        bit = self._slots.bit(worker_id)
        if self._approx_mask & bit:
            self._record_approx(worker_id, bit, hashes, now)
        else:
            journal = self._journals.get(worker_id)
            if journal is None:
                journal = self._journals[worker_id] = _Journal()
            journal.append(now, hashes, self.approx_max_blocks_per_worker, now - self.approx_ttl_s)

    def _record_approx(self, worker_id: str, bit: int, hashes: Iterable[int], now: float) -> None:
        entries = self._approx.get(worker_id)
        if entries is None:
            entries = self._approx[worker_id] = OrderedDict()
        holders = self._approx_holders
        for h in hashes:
            if h in entries:
                entries.move_to_end(h)
            else:
                holders[h] = holders.get(h, 0) | bit
            entries[h] = now
        while len(entries) > self.approx_max_blocks_per_worker:
            h, _ = entries.popitem(last=False)
            _clear_bit(holders, (h,), bit)

    def _expire_approx(self, now: float) -> None:
        cutoff = now - self.approx_ttl_s
        for worker_id, entries in self._approx.items():
            bit = self._slots.bit(worker_id)
            if not self._approx_mask & bit:
                continue  # not consulted; aged out when its events stop again
            while entries:
                h, touched = next(iter(entries.items()))
                if touched > cutoff:
                    break
                entries.popitem(last=False)
                _clear_bit(self._approx_holders, (h,), bit)

    # -- membership and query ----------------------------------------------------------------------

    def forget(self, worker_id: str) -> None:
        """Drops what the index holds of the worker's cache, exact and approximate, the worker
        staying a member in its mode: after a crash the blocks are gone, and a restarted worker
        starts cold until its snapshot says otherwise."""
        bit = self._slots.bit(worker_id)
        state = self._exact.get(worker_id)
        if state is not None:
            self._drop_exact_entries(worker_id, state)
        _clear_bit(self._approx_holders, self._approx.pop(worker_id, ()), bit)
        self._journals.pop(worker_id, None)

    def remove_worker(self, worker_id: str) -> None:
        bit = self._slots.bit(worker_id)
        state = self._exact.pop(worker_id, None)
        if state is not None:
            self._drop_exact_entries(worker_id, state)
        entries = self._approx.pop(worker_id, ())
        if self._approx_mask & bit:
            _clear_bit(self._approx_holders, entries, bit)
        self._approx_mask &= ~bit
        self._journals.pop(worker_id, None)
        self._slots.release(worker_id)

    def match_lengths(self, hashes: Sequence[int]) -> dict[str, int]:
        """For each worker holding the first block: how many leading blocks of `hashes` it holds."""
        if self._approx_mask:
            self._expire_approx(self._clock())
        if not hashes:
            return {}
        exact, approx, keep = self._exact_holders.get, self._approx_holders.get, ~self._approx_mask
        alive = (exact(hashes[0], 0) & keep) | approx(hashes[0], 0)
        matched: dict[str, int] = {}
        # One int AND per block; Python only touches a worker when its run of hits ends.
        for i in range(1, len(hashes)):
            if not alive:
                return matched
            h = hashes[i]
            still = alive & ((exact(h, 0) & keep) | approx(h, 0))
            if still != alive:
                self._name(matched, alive & ~still, i)
                alive = still
        self._name(matched, alive, len(hashes))
        return matched

    def tier_runs(self, hashes: Sequence[int], device: dict[str, int]) -> dict[str, TierRun]:
        """For each worker with events whose run of leading blocks goes on in its KV tiers past
        its device run (device: match_lengths' answer), how many of those blocks are in each
        tier. Workers without tiers cost one empty-set check each."""
        runs: dict[str, TierRun] = {}
        for worker_id, state in self._exact.items():
            if not (state.host or state.disk) or self._approx_mask & self._slots.bit(worker_id):
                continue  # no tiers, or its events are down: placements answer for it
            start = i = device.get(worker_id, 0)
            host = 0
            while i < len(hashes) and (hashes[i] in state.host or hashes[i] in state.disk):
                host += hashes[i] in state.host
                i += 1
            if i > start:
                runs[worker_id] = TierRun(host, i - start - host)
        return runs

    def _name(self, matched: dict[str, int], bits: int, length: int) -> None:
        ids = self._slots.ids
        while bits:
            low = bits & -bits
            matched[ids[low.bit_length() - 1]] = length
            bits ^= low
