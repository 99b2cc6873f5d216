"""prompt_cache_key as a routing affinity: the router keeps requests that share a key on the worker
the first went to, whatever their prompts, while that worker stays below the sticky threshold."""
from __future__ import annotations

from baton.services.common.messages.router import Placement, PlaceRequest
from baton.services.router.affinity_keys import AffinityKeys

from .test_router import add, make_router

NO_AFFINITY_KEY = "prefix_overlap:2,kv_utilization:1,queued_prefill_tokens:1,inflight_requests:1"


def prompt(i: int) -> list[int]:
    """Prompts that share no block: the prefix index gives no reason to keep them together."""
    return [1000 * (i + 1) + t for t in range(64)]


def place(router, i: int, key: str, tenant: str = "acme") -> Placement:
    placement = router.place(PlaceRequest(f"r{i}-{tenant}", prompt(i), tenant=tenant,
                                          max_tokens=8, affinity_key=key))
    assert isinstance(placement, Placement)
    return placement


def test_one_key_stays_on_its_first_worker_whatever_the_prompts():
    router, clock, _, _ = make_router(tie_tolerance=0.0)  # any reservation tells workers apart
    for w in ("d0", "d1", "d2"):
        add(router, clock, w)
    first = place(router, 0, "conversation-1")
    assert first.reason == "load"
    # every further placement reserves load on that worker, so only the key keeps them there
    later = [place(router, i, "conversation-1") for i in range(1, 6)]
    assert {p.decode_worker_id for p in later} == {first.decode_worker_id}
    assert {p.reason for p in later} == {"prefix_affinity"}
    # another tenant's key of the same name is another key: it goes by load, off the busy worker
    assert place(router, 9, "conversation-1", tenant="zeta").decode_worker_id != \
        first.decode_worker_id
    # and requests without a key are spread by load as before
    assert place(router, 10, "").decode_worker_id != first.decode_worker_id


def test_a_key_leaves_its_worker_past_the_sticky_threshold_and_follows_the_new_one():
    router, clock, _, _ = make_router(sticky_inflight_requests=2, tie_tolerance=0.0)
    for w in ("d0", "d1"):
        add(router, clock, w)
    first = [place(router, i, "k") for i in range(2)]
    assert first[0].decode_worker_id == first[1].decode_worker_id
    moved = place(router, 2, "k")
    assert (moved.decode_worker_id, moved.reason) != (first[0].decode_worker_id, "prefix_affinity")
    assert moved.decode_worker_id != first[0].decode_worker_id
    # the key now names the worker it moved to; releasing the old one's leases changes nothing
    for placement in first:
        router.release(placement.lease_id)
    assert place(router, 3, "k").decode_worker_id == moved.decode_worker_id


def test_without_the_scorer_a_key_pins_nothing():
    router, clock, _, _ = make_router(scorers=NO_AFFINITY_KEY, tie_tolerance=0.0)
    for w in ("d0", "d1"):
        add(router, clock, w)
    first = place(router, 0, "k")
    # the first worker now has a reservation: by load alone the next goes to the other
    assert place(router, 1, "k").decode_worker_id != first.decode_worker_id


def test_the_table_forgets_the_least_recently_used_key():
    keys = AffinityKeys(capacity=2)
    keys.record("t", "a", ["d0"])
    keys.record("t", "b", ["d1"])
    assert keys.workers_for("t", "a") == {"d0"}  # a is now the more recent
    keys.record("t", "c", ["d2"])
    assert len(keys) == 2 and keys.workers_for("t", "b") == frozenset()
    assert keys.workers_for("t", "a") == {"d0"} and keys.workers_for("t", "c") == {"d2"}
    assert keys.workers_for("t", "") == frozenset() and keys.workers_for("u", "a") == frozenset()
    AffinityKeys(capacity=0).record("t", "a", ["d0"])  # remembers nothing, refuses nothing
