"""Statistics on hand-built timelines whose answers are known."""
from __future__ import annotations

import math

import pytest

from baton.loadtest.prometheus import bucket_of, diff, histogram_quantile, parse_histogram
from baton.loadtest.stats import (FAILED, OK, REFUSED, SLO, RequestResult, attainment,
                                  distserve_goodput, goodput_rps, percentiles, prefix_reuse_bound,
                                  summarize)


def answered(ttft: float, gaps: list[float], start: float = 0.0) -> RequestResult:
    """A request whose tokens came at ttft, then after each gap."""
    return RequestResult(start, OK, ttft_s=ttft, e2e_s=ttft + sum(gaps), itls_s=gaps,
                         output_tokens=len(gaps) + 1)


def test_percentiles_interpolate_linearly_between_order_statistics():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentiles(values) == {
        "p50": 50.5, "p90": pytest.approx(90.1), "p99": pytest.approx(99.01)
    }
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}


def test_tpot_excludes_the_first_token_and_is_undefined_for_one_token():
    r = answered(0.5, [0.1, 0.2, 0.3])  # 4 tokens, E2E 1.1 s
    assert r.tpot_s == pytest.approx((1.1 - 0.5) / 3)
    assert answered(0.5, []).tpot_s is None
    assert RequestResult(0, FAILED).tpot_s is None


def test_itl_pools_every_gap_and_tpot_averages_per_request():
    # One request with 10 fast gaps, one with 1 slow gap: ITL is dominated by the fast gaps, TPOT is
    # per request.
    results = [answered(0.1, [0.01] * 10), answered(0.1, [1.0])]
    s = summarize(results, duration_s=10)
    assert s["itl_ms"]["p50"] == pytest.approx(10.0)
    assert s["tpot_ms"]["mean"] == pytest.approx((10 + 1000) / 2)


def test_refused_and_failed_count_against_attainment_and_goodput():
    slo = SLO(ttft_ms=200, tpot_ms=50)
    results = [answered(0.1, [0.02, 0.02]),  # meets both
               answered(0.3, [0.02]),  # TTFT too slow
               answered(0.1, [0.06, 0.06]),  # TPOT too slow
               answered(0.1, []),  # one token: no TPOT, meets TTFT
               RequestResult(0, REFUSED, error="HTTP 429"),
               RequestResult(0, FAILED, error="reset")]
    assert attainment(results, slo) == pytest.approx(2 / 6)
    assert goodput_rps(results, slo, duration_s=4) == pytest.approx(0.5)
    s = summarize(results, 4, slo)
    assert (s["completed"], s["refused"], s["failed"]) == (4, 1, 1)
    # Failures add no latency samples: TTFT p50 is over the four answered requests only.
    assert s["ttft_ms"]["p50"] == pytest.approx(100)


def test_a_single_slo_checks_only_its_own_target():
    results = [answered(0.1, [1.0]), answered(1.0, [0.001])]
    assert attainment(results, SLO(ttft_ms=500)) == 0.5
    assert attainment(results, SLO(tpot_ms=10)) == 0.5
    assert attainment(results, SLO()) is None and goodput_rps(results, SLO(), 1) is None


def test_distserve_goodput_is_the_highest_rate_with_90_percent_attainment():
    assert distserve_goodput([(1, 1.0), (2, 0.95), (4, 0.9), (8, 0.5)]) == 4
    assert distserve_goodput([(1, 0.89), (2, 0.5)]) is None
    assert distserve_goodput([(1, 0.99), (2, None)]) == 1


TEXT = """# TYPE h histogram
h_bucket{le="0.1"} 2
h_bucket{le="0.2"} 6
h_bucket{le="0.4"} 10
h_bucket{le="+Inf"} 10
h_count 10
other_bucket{le="0.1"} 99
"""


def test_histogram_quantile_interpolates_inside_the_bucket_like_prometheus():
    b = parse_histogram(TEXT, "h")
    assert b == [(0.1, 2), (0.2, 6), (0.4, 10), (math.inf, 10)]
    # rank 5: 3/4 of the way through (0.1, 0.2]
    assert histogram_quantile(0.5, b) == pytest.approx(0.175)
    assert histogram_quantile(0.1, b) == pytest.approx(0.05)  # rank 1 in the first bucket, from 0
    assert histogram_quantile(0.9, b) == pytest.approx(0.35)
    assert bucket_of(0.15, b) == (0.1, 0.2)
    assert histogram_quantile(0.5, [(0.1, 0), (math.inf, 0)]) is None


def test_a_rank_in_the_inf_bucket_gives_the_highest_finite_bound_and_diff_isolates_a_run():
    before = [(0.1, 5), (math.inf, 5)]
    after = [(0.1, 5), (math.inf, 9)]
    run = diff(after, before)
    assert run == [(0.1, 0), (math.inf, 4)]
    assert histogram_quantile(0.5, run) == 0.1


def test_prefix_hit_ratio_counts_only_answers_that_report_cached_tokens():
    results = [RequestResult(0, OK, ttft_s=0.1, e2e_s=0.2, prompt_tokens=100, cached_tokens=64),
               RequestResult(0, OK, ttft_s=0.1, e2e_s=0.2, prompt_tokens=300, cached_tokens=0),
               # a server that does not say
               RequestResult(0, OK, ttft_s=0.1, e2e_s=0.2, prompt_tokens=1000),
               RequestResult(0, FAILED, prompt_tokens=500, cached_tokens=500)]
    assert summarize(results, duration_s=1)["prefix_hit_ratio"] == pytest.approx(64 / 400)
    assert summarize(results[2:], duration_s=1)["prefix_hit_ratio"] is None


def test_prefix_reuse_bound_counts_leading_blocks_seen_before_and_never_the_last_token():
    a = list(range(64))  # four blocks of 16
    prompts = [a,  # nothing seen yet
               a[:48] + [900] * 16,  # three leading blocks seen: 48 hits
               [7] * 16 + a[16:],  # a different first block: no leading hit, whatever follows
               a]  # all four blocks seen, but the last token is always computed: 63 hits
    assert prefix_reuse_bound(prompts, 16) == pytest.approx((48 + 63) / (4 * 64))
    assert prefix_reuse_bound([], 16) is None
