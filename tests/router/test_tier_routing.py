"""KV tiers in the router: events and snapshots say which tier a block is in, the prefix index keeps
it, and the prefix scorer values a host-tier hit below a device hit and above a miss by the load
cost the worker measured against its prefill rate (services/router/tier_value.py)."""
from __future__ import annotations

import pytest

from baton.services.common.block_hash import block_hashes
from baton.services.common.messages.router import Placement, PlaceRequest
from baton.services.common.messages.worker import EventKind, KVEvent, Medium
from baton.services.common.roles import Role
from baton.services.common.wire.router import (kv_events_from_proto, kv_snapshot_from_proto,
                                               load_report_from_proto)
from baton.services.router.prefix_index import TierRun
from baton.services.router.tier_value import tier_weight
from baton.v1 import worker_pb2

from .helpers import stats
from .test_prefix_index import make
from .test_router import PROMPT, add, make_router, stored

STORED, REMOVED, CLEARED = EventKind.STORED, EventKind.REMOVED, EventKind.CLEARED
HOST, DISK = Medium.HOST, Medium.DISK


def ev(seq: int, kind: EventKind, medium: Medium, *hashes: int) -> KVEvent:
    return KVEvent(seq, kind, hashes, medium)


def test_medium_numbers_match_the_wire():
    assert [Medium.DEVICE, Medium.HOST, Medium.DISK] == [
        worker_pb2.KV_MEDIUM_DEVICE, worker_pb2.KV_MEDIUM_HOST, worker_pb2.KV_MEDIUM_DISK]


def test_tier_runs_continue_the_device_run_per_tier():
    index, _ = make()
    assert index.apply_events("w", [
        KVEvent(1, STORED, (1, 2)),  # device
        ev(2, STORED, HOST, 2, 3, 4), ev(3, STORED, DISK, 5, 6), ev(4, STORED, HOST, 8)])
    device = index.match_lengths([1, 2, 3, 4, 5, 6, 7, 8])
    assert device == {"w": 2}  # the tiers do not count as device hits
    # Block 2 is in both: it is in the device run. Then 3, 4 from host, 5, 6 from disk; 7 is
    # nowhere, so 8 is not reachable.
    assert index.tier_runs([1, 2, 3, 4, 5, 6, 7, 8], device) == {"w": TierRun(host=2, disk=2)}
    assert index.apply_events("w", [ev(5, REMOVED, HOST, 4)])
    assert index.tier_runs([1, 2, 3, 4, 5], device) == {"w": TierRun(host=1)}
    # A worker with nothing on the device may still load its whole prefix from a tier.
    assert index.tier_runs([3, 4], {}) == {"w": TierRun(host=1)}
    assert index.apply_events("w", [KVEvent(6, CLEARED, ())])
    assert index.tier_runs([1, 2, 3], {}) == {} and index.match_lengths([1]) == {}


def test_snapshot_carries_tiers_and_a_worker_without_events_has_none():
    index, _ = make()
    snapshot = kv_snapshot_from_proto(worker_pb2.KVSnapshot(
        worker_id="w", sequence=3, block_hashes=[1], host_block_hashes=[2],
        disk_block_hashes=[3]))
    index.apply_snapshot("w", snapshot.sequence, snapshot.block_hashes,
                         snapshot.host_block_hashes, snapshot.disk_block_hashes)
    assert index.tier_runs([1, 2, 3], {"w": 1}) == {"w": TierRun(host=1, disk=1)}
    index.set_events_available("w", False)  # placements answer for it now: tiers unknown
    assert index.tier_runs([1, 2, 3], {"w": 1}) == {}
    index.set_events_available("w", True)
    index.forget("w")
    assert index.tier_runs([1, 2, 3], {}) == {}


def test_event_medium_crosses_the_wire():
    batch = worker_pb2.KVEventBatch(worker_id="w", events=[
        worker_pb2.KVEvent(sequence=1, kind=worker_pb2.KVEvent.KIND_STORED, block_hashes=[7],
                           medium=worker_pb2.KV_MEDIUM_DISK),
        worker_pb2.KVEvent(sequence=2, kind=worker_pb2.KVEvent.KIND_STORED, block_hashes=[8])])
    assert [e.medium for e in kv_events_from_proto(batch).events] == [DISK, Medium.DEVICE]


@pytest.mark.parametrize("load_s, rate, expected", [
    (0.0008, 10_000.0, 0.5),  # loading a block costs half of computing its 16 tokens
    (0.0001, 10_000.0, 1 - 1 / 16),
    (0.0016, 10_000.0, 0.0),  # as slow as recomputing: worth a miss
    (0.01, 10_000.0, 0.0),
    (0.0, 10_000.0, 0.0),  # nothing measured yet: not guessed
])
def test_tier_weight_is_the_saved_share_of_prefill(load_s, rate, expected):
    assert tier_weight(load_s, rate, 16) == pytest.approx(expected)


def add_tiered(router, clock, worker_id: str, host_load_s: float) -> None:
    router.register_worker(worker_id, f"{worker_id}:1", Role.DECODE, model="m", block_size=16)
    report = stats(worker_id, clock())
    report.host_load_seconds_per_block = host_load_s
    router.on_stats(load_report_from_proto(report))
    event = worker_pb2.KVEvent(sequence=1, kind=worker_pb2.KVEvent.KIND_STORED,
                               block_hashes=block_hashes(PROMPT, 16, "m"),
                               medium=worker_pb2.KV_MEDIUM_HOST)
    assert router.on_kv_events(
        kv_events_from_proto(worker_pb2.KVEventBatch(worker_id=worker_id, events=[event])))


def test_host_hit_places_below_a_device_hit_and_above_a_miss():
    router, clock, _, _ = make_router()
    add(router, clock, "miss")
    # Loading a block costs this worker half of computing it (10,000 prompt tokens/s).
    add_tiered(router, clock, "host", host_load_s=0.0008)
    placement = router.place(PlaceRequest("r1", PROMPT))
    assert isinstance(placement, Placement)
    assert (placement.decode_worker_id, placement.reason) == ("host", "prefix_affinity")
    # Its TTFT is predicted from half the prompt's prefill work, and no device hit is claimed.
    assert placement.predicted_ttft_s == pytest.approx(1024 / 10_000, rel=1e-3)
    assert placement.cached_tokens == 0
    add(router, clock, "device")
    stored(router, "device", PROMPT)
    assert router.place(PlaceRequest("r2", PROMPT)).decode_worker_id == "device"


def test_host_tier_slower_than_prefill_scores_as_a_miss():
    router, clock, _, _ = make_router()
    add_tiered(router, clock, "slow", host_load_s=0.01)  # 6x the cost of computing a block
    placement = router.place(PlaceRequest("r", PROMPT))
    assert placement.predicted_ttft_s == pytest.approx(2048 / 10_000)
