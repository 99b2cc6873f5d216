from __future__ import annotations

import random
from collections import Counter

import pytest

from baton.services.common.roles import Role
from baton.services.router.plugins.base import SchedulingRequest
from baton.services.router.plugins.filters import default_filters
from baton.services.router.plugins.picker import Picker, StickyPolicy
from baton.services.router.plugins.scorers import (InFlightRequestsScorer, KVUtilizationScorer,
                                                   PrefixOverlapScorer, QueuedPrefillTokensScorer)

from .helpers import LIMITS, report, worker

NOW = 100.0


def req(prompt_tokens: int = 160, **cached: int) -> SchedulingRequest:
    return SchedulingRequest("r", prompt_tokens, 16, NOW, dict(cached))


@pytest.mark.parametrize("prompt_tokens, cached_blocks, expected", [
    (160, 0, 0.0),
    (160, 5, 0.5),
    (160, 10, 1.0),
    (150, 10, 1.0),  # the last partial block never counts as more than the prompt
    (0, 0, 1.0),
])
def test_prefix_overlap_scores_the_cached_share(prompt_tokens, cached_blocks, expected):
    r = req(prompt_tokens, w=cached_blocks)
    assert PrefixOverlapScorer(1.0).score(r, worker("w", at=NOW)) == pytest.approx(expected)
    assert r.uncached_tokens("w") == round(prompt_tokens * (1 - expected))


@pytest.mark.parametrize("scorer, load, expected", [
    (KVUtilizationScorer(1.0, 2.0), {"kv_used": 250}, 0.75),
    (KVUtilizationScorer(1.0, 2.0), {"kv_used": 1000}, 0.0),
    (QueuedPrefillTokensScorer(1.0, 2.0, 8000), {"queued": 2000}, 0.75),
    (QueuedPrefillTokensScorer(1.0, 2.0, 8000), {"queued": 20000}, 0.0),  # clamped past saturation
    (InFlightRequestsScorer(1.0, 2.0, 40), {"running": 8, "waiting": 2}, 0.75),
    (InFlightRequestsScorer(1.0, 2.0, 40), {}, 1.0),
])
def test_load_scorers(scorer, load, expected):
    assert scorer.score(req(), worker("w", at=NOW, **load)) == pytest.approx(expected)


@pytest.mark.parametrize("scorer", [
    KVUtilizationScorer(1.0, 2.0),
    QueuedPrefillTokensScorer(1.0, 2.0, 8000),
    InFlightRequestsScorer(1.0, 2.0, 40)
])
def test_load_scorers_give_stale_workers_nothing(scorer):
    assert scorer.score(req(), worker("w", at=NOW - 3)) == 0.0  # idle, but three seconds ago
    assert scorer.score(req(), worker("w")) == 0.0  # never reported


def test_filters_drop_dead_broken_draining_and_wrong_role():
    ok = worker("ok", at=NOW)
    dead = worker("dead", at=NOW)
    dead.lease_expires_at = NOW
    broken = worker("broken", at=NOW)
    for t in range(3):
        broken.breaker.record_failure(NOW - 1 + t * 0.1)
    draining = worker("draining", at=NOW, draining=True)
    prefill = worker("prefill", Role.PREFILL, at=NOW)
    mixed = worker("mixed", Role.MIXED, at=NOW)
    picker = make_picker()
    kept = picker.candidates(req(), [ok, dead, broken, draining, prefill, mixed])
    assert [w.worker_id for w in kept] == ["ok", "mixed"]


def make_picker(sticky_tokens: int = 1000, min_fraction: float = 0.25, seed: int = 0,
                tolerance: float = 1e-6, sticky_requests: int = 32) -> Picker:
    scorers = [PrefixOverlapScorer(2.0), QueuedPrefillTokensScorer(1.0, 2.0, 10_000),
               InFlightRequestsScorer(1.0, 2.0, 100)]
    sticky = StickyPolicy(sticky_tokens, sticky_requests, min_fraction)
    return Picker(default_filters([Role.DECODE, Role.MIXED]), scorers, sticky,
                  LIMITS, random.Random(seed), tolerance)


def test_weighted_total_score():
    w = worker("w", at=NOW, queued=5000, running=50)
    # (2 * 0.5 + 1 * 0.5 + 1 * 0.5) / 4
    assert make_picker().total_score(req(w=5), w) == pytest.approx(0.5)


def test_sticky_until_saturated_then_spread_by_load():
    warm = worker("warm", at=NOW)
    others = [worker(f"cold{i}", at=NOW) for i in range(3)]
    picker = make_picker(sticky_tokens=1000)
    r = req(160, warm=10)
    picks = []
    for i in range(12):
        pick = picker.pick(r, [warm, *others])
        picks.append((pick.worker.worker_id, pick.reason))
        # Charge a full prompt even for hits, standing in for the decode work each request brings.
        pick.worker.reserve(f"l{i}", NOW, 160, 0)
    # The warm worker keeps the prefix until 7 x 160 queued tokens pass the 1000-token threshold;
    # then the cold workers take turns by load, and the warm one gets nothing more although its
    # cache would still score best.
    assert picks[:7] == [("warm", "prefix_affinity")] * 7
    assert all(reason == "load" for _, reason in picks[7:])
    cold_counts = Counter(w for w, _ in picks[7:])
    assert "warm" not in cold_counts and sorted(cold_counts.values()) == [1, 2, 2]
    # Once the warm worker reports its queue drained, affinity resumes.
    warm.on_stats(report("warm", NOW + 1, queued=0))
    assert picker.pick(r, [warm, *others]).reason == "prefix_affinity"


def test_cache_hits_lose_affinity_by_request_count():
    warm, cold = worker("warm", at=NOW, running=4), worker("cold", at=NOW)
    picker = make_picker(sticky_requests=5)
    r = req(160, warm=10)
    first = picker.pick(r, [warm, cold])
    # a full hit queues no prefill tokens, but it is a fifth request
    first.worker.reserve("l0", NOW, 0, 0)
    second = picker.pick(r, [warm, cold])
    assert (first.worker.worker_id, second.worker.worker_id, second.reason) == ("warm", "cold",
                                                                                "load")


def test_next_warmest_worker_takes_over_before_load_spreading():
    best = worker("best", at=NOW, queued=5000)
    second = worker("second", at=NOW)
    cold = worker("cold", at=NOW)
    pick = make_picker(sticky_tokens=1000).pick(req(160, best=10, second=6), [best, second, cold])
    assert (pick.worker.worker_id, pick.reason) == ("second", "prefix_affinity")


@pytest.mark.parametrize("cached, expected", [
    # a 10% shared prefix (say a system prompt) is no reason to stick
    ({"warm": 1}, ("cold", "load")),
    ({"warm": 3}, ("warm", "prefix_affinity")),
])
def test_affinity_needs_a_meaningful_prefix(cached, expected):
    warm, cold = worker("warm", at=NOW, queued=500), worker("cold", at=NOW)
    pick = make_picker().pick(req(160, **cached), [warm, cold])
    assert (pick.worker.worker_id, pick.reason) == expected


def test_longest_prefix_wins_affinity():
    a, b = worker("a", at=NOW), worker("b", at=NOW)
    assert make_picker().pick(req(160, a=6, b=8), [a, b]).worker.worker_id == "b"


def test_all_saturated_still_picks_the_least_bad():
    busy = worker("busy", at=NOW, queued=20_000)
    stale = worker("stale", at=NOW - 10)
    pick = make_picker().pick(req(), [busy, stale])
    assert pick.reason == "all_saturated" and pick.worker.worker_id == "busy"


def test_no_candidates():
    assert make_picker().pick(req(), [worker("p", Role.PREFILL, at=NOW)]) is None


def test_ties_are_drawn_at_random_not_herded():
    pool = [worker(f"w{i}", at=NOW) for i in range(4)]
    counts = Counter(make_picker(seed=s).pick(req(), pool).worker.worker_id for s in range(400))
    # Identical workers: each is drawn; a deterministic tie-break would give one of them all 400.
    assert set(counts) == {"w0", "w1", "w2", "w3"} and max(counts.values()) < 150


def test_same_seed_same_choices():
    pool = [worker(f"w{i}", at=NOW) for i in range(4)]
    first = [make_picker(seed=7).pick(req(), pool).worker.worker_id for _ in range(5)]
    assert first == [make_picker(seed=7).pick(req(), pool).worker.worker_id for _ in range(5)]


def test_tie_tolerance_widens_the_draw():
    a, b = worker("a", at=NOW, queued=100), worker("b", at=NOW)  # b scores higher by 0.005
    strict = Counter(make_picker(seed=s).pick(req(), [a, b]).worker.worker_id for s in range(50))
    loose = Counter(
        make_picker(seed=s, tolerance=0.01).pick(req(), [a, b]).worker.worker_id for s in range(50))
    assert strict == {"b": 50}
    assert set(loose) == {"a", "b"}
