from __future__ import annotations

import gc

import pytest

from baton.services.common.block_hash import block_hashes
from baton.services.common.messages.worker import EventKind, KVEvent
from baton.services.router.prefix_index import PrefixIndex
from baton.v1 import worker_pb2

from .helpers import Clock

Kind = worker_pb2.KVEvent
STORED, REMOVED, CLEARED = Kind.KIND_STORED, Kind.KIND_REMOVED, Kind.KIND_CLEARED


def ev(seq: int, kind: int, *hashes: int) -> KVEvent:
    return KVEvent(seq, EventKind(kind), hashes)


def make(ttl: float = 60.0, cap: int = 1000) -> tuple[PrefixIndex, Clock]:
    clock = Clock()
    return PrefixIndex(ttl, cap, clock), clock


def test_event_kinds_match_the_worker_contract():
    assert [EventKind.STORED, EventKind.REMOVED, EventKind.CLEARED] == [STORED, REMOVED, CLEARED]


@pytest.mark.parametrize("events, expected", [
    ([ev(1, STORED, 1, 2, 3)], {"w": 3}),
    ([ev(1, STORED, 1, 2, 3), ev(2, REMOVED, 2)], {"w": 1}),
    ([ev(1, STORED, 1, 2, 3), ev(2, REMOVED, 1)], {}),
    ([ev(1, STORED, 1, 2, 3), ev(2, CLEARED)], {}),
    # applied in sequence order, not arrival order
    ([ev(2, REMOVED, 3), ev(1, STORED, 1, 2, 3)], {"w": 2}),
    # a replayed event is skipped
    ([ev(1, STORED, 1), ev(1, STORED, 1), ev(2, STORED, 2)], {"w": 2}),
])
def test_events_fold_into_leading_matches(events, expected):
    index, _ = make()
    assert index.apply_events("w", events)
    assert index.match_lengths([1, 2, 3, 4]) == expected


def test_match_counts_leading_blocks_per_worker():
    index, _ = make()
    index.apply_events("a", [ev(1, STORED, 1, 2, 3, 4)])
    index.apply_events("b", [ev(1, STORED, 1, 2, 9)])
    # holds later blocks but not the first: no prefix
    index.apply_events("c", [ev(1, STORED, 2, 3, 4)])
    assert index.match_lengths([1, 2, 3, 4]) == {"a": 4, "b": 2}
    assert index.match_lengths([7, 1]) == {}
    assert index.match_lengths([]) == {}


@pytest.mark.parametrize("batch, gap_flag", [
    ([ev(1, STORED, 1), ev(3, STORED, 2)], False),  # sequence 2 went missing
    ([ev(2, STORED, 2)], False),  # the stream began after events were dropped
    ([ev(1, STORED, 1)], True),  # the worker says it dropped events
])
def test_gap_needs_resync_and_snapshot_replaces_entries(batch, gap_flag):
    index, _ = make()
    assert not index.apply_events("w", batch, gap=gap_flag)
    assert index.needs_resync("w")
    assert not index.apply_events("w", [ev(10, STORED, 5)])  # ignored until the snapshot
    assert index.match_lengths([5]) == {}
    index.apply_snapshot("w", 20, [1, 2, 7])
    assert not index.needs_resync("w") and index.last_sequence("w") == 20
    assert index.match_lengths([1, 2, 7]) == {"w": 3}
    # 20 was in the snapshot already
    assert index.apply_events("w", [ev(20, REMOVED, 1), ev(21, REMOVED, 7)])
    assert index.match_lengths([1, 2, 7]) == {"w": 2}


def test_snapshot_drops_entries_the_worker_no_longer_has():
    index, _ = make()
    index.apply_events("w", [ev(1, STORED, 1, 2, 3)])
    index.apply_snapshot("w", 5, [9])
    assert index.match_lengths([1, 2, 3]) == {}
    assert index.match_lengths([9]) == {"w": 1}


def test_approximate_mode_answers_from_placements_for_workers_without_events():
    index, _ = make()
    index.apply_events("exact", [ev(1, STORED, 1, 2)])
    index.record_placement("exact", [1, 2, 3])  # placements never override a live event stream
    index.set_events_available("approx", False)
    index.record_placement("approx", [1, 2, 3])
    assert index.match_lengths([1, 2, 3]) == {"exact": 2, "approx": 3}
    index.set_events_available("exact", False)
    assert index.match_lengths([1, 2, 3]) == {"exact": 3, "approx": 3}


def test_approximate_entries_expire_after_ttl_and_touches_renew_them():
    index, clock = make(ttl=10.0)
    index.set_events_available("w", False)
    index.record_placement("w", [1, 2])
    clock.advance(6)
    index.record_placement("w", [1])
    clock.advance(6)  # block 2 is 12 s old, block 1 only 6 s
    assert index.match_lengths([1, 2]) == {"w": 1}
    clock.advance(5)
    assert index.match_lengths([1, 2]) == {}


def test_approximate_entries_are_bounded_per_worker_least_recent_first():
    index, clock = make(cap=3)
    index.set_events_available("w", False)
    index.record_placement("w", [1, 2, 3])
    clock.advance(1)
    index.record_placement("w", [1, 4])  # evicts 2, the least recently routed
    assert index.match_lengths([1, 2]) == {"w": 1}
    assert index.match_lengths([1, 4]) == {"w": 2}
    assert index.match_lengths([3]) == {"w": 1}


def test_remove_worker_forgets_both_sources():
    index, _ = make()
    index.apply_events("w", [ev(1, STORED, 1)])
    index.set_events_available("v", False)
    index.record_placement("v", [1])
    index.remove_worker("w")
    index.remove_worker("v")
    assert index.match_lengths([1]) == {}


def test_tenant_salt_keeps_tenants_apart():
    tokens = list(range(64))
    index, _ = make()
    index.apply_events("w", [ev(1, STORED, *block_hashes(tokens, 16, "m", cache_salt="tenant-a"))])
    assert index.match_lengths(block_hashes(tokens, 16, "m", cache_salt="tenant-a")) == {"w": 4}
    assert index.match_lengths(block_hashes(tokens, 16, "m", cache_salt="tenant-b")) == {}


def test_placements_on_live_workers_are_replayed_when_their_events_stop():
    index, clock = make(ttl=60.0, cap=3)
    index.apply_events("w", [ev(1, STORED, 9)])
    index.record_placement("w", [1, 2])
    index.record_placement("w", [3, 4])
    clock.advance(1)
    index.record_placement("w", [5, 6])
    assert index.match_lengths([5, 6]) == {}  # events are live: placements are not believed
    index.set_events_available("w", False)
    # As if recorded all along: bounded to the 3 most recently routed blocks, the event-fed block no
    # longer used.
    assert index.match_lengths([4, 5, 6]) == {"w": 3}
    assert index.match_lengths([3]) == {} and index.match_lengths([9]) == {}
    clock.advance(59.5)  # [4] was routed 60.5 s ago, [5, 6] 59.5 s ago
    assert index.match_lengths([4]) == {} and index.match_lengths([5, 6]) == {"w": 2}


def test_journal_drops_placements_past_the_ttl():
    index, clock = make(ttl=10.0)
    index.apply_events("w", [ev(1, STORED, 9)])
    index.record_placement("w", [1])
    clock.advance(11)
    index.record_placement("w", [2])
    index.set_events_available("w", False)
    assert index.match_lengths([1]) == {} and index.match_lengths([2]) == {"w": 1}


def test_entries_of_a_worker_back_on_events_return_when_they_stop_again():
    index, _ = make()
    index.set_events_available("w", False)
    index.record_placement("w", [1, 2])
    index.set_events_available("w", True)
    assert index.match_lengths([1, 2]) == {}
    index.set_events_available("w", False)
    assert index.match_lengths([1, 2]) == {"w": 2}


def test_holder_sets_are_invisible_to_the_garbage_collector():
    # Millions of per-hash containers made every full collection walk them (pauses of hundreds of
    # ms).
    index, _ = make()
    index.apply_events("w", [ev(1, STORED, *range(1, 1000))])
    index.set_events_available("v", False)
    index.record_placement("v", list(range(1, 1000)))
    assert not any(gc.is_tracked(holders) for holders in index._exact_holders.values())
    assert not any(gc.is_tracked(holders) for holders in index._approx_holders.values())
