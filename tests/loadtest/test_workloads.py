"""Arrivals and workloads: rates, burstiness, determinism, and the shape each workload promises."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from baton.loadtest.arrivals import (gamma_arrivals, poisson_arrivals, rescaled_trace_arrivals,
                                     trace_time_factor)
from baton.loadtest.scenarios import WorkloadSpec, iter_requests
from baton.loadtest.traces import trace_path


def _cv(times: list[float]) -> float:
    gaps = np.diff(times)
    return float(gaps.std() / gaps.mean())


def test_poisson_arrivals_have_the_rate_and_unit_gap_cv():
    times = poisson_arrivals(50, 200, seed=1)
    assert len(times) == pytest.approx(10000, rel=0.05)
    assert _cv(times) == pytest.approx(1.0, abs=0.05)
    assert all(0 <= t < 200 for t in times) and times == sorted(times)
    assert times == poisson_arrivals(50, 200, seed=1)


def test_gamma_burstiness_below_one_makes_gaps_more_variable():
    bursty = gamma_arrivals(50, 200, burstiness=0.25, seed=1)
    assert len(bursty) == pytest.approx(10000, rel=0.1)
    assert _cv(bursty) == pytest.approx(2.0, rel=0.1)  # CV = 1/sqrt(shape)


def test_trace_arrivals_keep_their_shape_at_the_asked_rate():
    trace = [100.0, 101.0, 101.5, 104.0, 108.0]  # 4 gaps in 8 s: 0.5/s
    times = rescaled_trace_arrivals(trace, rate=2.0, duration_s=100)
    assert times == [0.0, 0.25, 0.375, 1.0, 2.0]
    assert trace_time_factor(trace, 2.0) == 4.0
    assert rescaled_trace_arrivals(trace, rate=2.0, duration_s=1.0) == [0.0, 0.25, 0.375]


def test_synthetic_lengths_are_long_tailed_and_within_the_context():
    reqs = list(itertools.islice(iter_requests(WorkloadSpec("synthetic", 512, max_len=1024)), 2000))
    ins = np.array([len(r.prompt) for r in reqs])
    assert np.percentile(ins, 99) > 5 * np.median(ins)  # a heavy tail, not a uniform spread
    assert all(len(r.prompt) + r.output_len <= 1024 for r in reqs)
    assert all(0 <= t < 512 - 16 for r in reqs[:50] for t in r.prompt)


def test_shared_prefix_requests_start_with_one_of_the_system_prompts():
    spec = WorkloadSpec("shared-prefix", 512, prefix_len=64, num_prefixes=3)
    reqs = list(itertools.islice(iter_requests(spec), 300))
    prefixes = {tuple(r.prompt[:64]) for r in reqs}
    assert len(prefixes) == 3
    # the popular one
    assert max(sum(tuple(r.prompt[:64]) == p for r in reqs) for p in prefixes) > 100


def test_multi_turn_turns_resend_the_whole_history():
    reqs = list(
        itertools.islice(iter_requests(WorkloadSpec("multi-turn", 512, sessions=2, turns=3)), 40))
    last: dict[int, list[int]] = {}
    grew = 0
    for r in reqs:
        if r.session in last:
            assert r.prompt[:len(last[r.session])] == last[r.session]
            grew += 1
        last[r.session] = r.prompt
    assert grew >= 10 and len(last) > 2  # sessions end after their turns and new ones start


def test_mooncake_replay_shares_blocks_where_hash_ids_are_shared():
    try:
        trace_path("mooncake-conv")
    except FileNotFoundError:
        pytest.skip("traces not available")
    spec = WorkloadSpec("mooncake-conv", 4096, length_scale=32, max_len=4096)
    reqs = list(itertools.islice(iter_requests(spec), 200))
    assert all(r.trace_s is not None for r in reqs)
    assert [r.trace_s for r in reqs] == sorted(r.trace_s for r in reqs)
    firsts = [tuple(r.prompt[:16]) for r in reqs if len(r.prompt) >= 16]
    # requests with a common first hash id share their first 16 tokens
    assert len(set(firsts)) < len(firsts)
