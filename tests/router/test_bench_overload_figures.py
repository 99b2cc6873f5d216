"""The overload bench's per-run figures, from a loadtest point's per-request records."""
from __future__ import annotations

import pytest

from baton.loadtest.stats import SLO
from baton.loadtest.commands.bench_overload import figures, verdict


def request(status: str, ttft_s=None, e2e_s=None, tokens=0, refusal_s=None) -> dict:
    return dict(status=status, ttft_s=ttft_s, e2e_s=e2e_s, output_tokens=tokens,
                refusal_s=refusal_s)


def test_late_admissions_and_refusal_latency_are_counted_per_request():
    requests = [request("ok", 0.5, 0.5 + 9 * 0.05, 10),  # on time
                request("ok", 2.5, 2.5 + 9 * 0.05, 10),  # late first token
                request("ok", 0.5, 0.5 + 9 * 0.2, 10),  # slow tokens
                request("refused", refusal_s=0.004), request("refused", refusal_s=0.006),
                request("failed")]
    summary = dict(requests=6, completed=3, refused=2, failed=1, goodput_rps=0.1,
                   slo_attainment=1 / 6)
    row = figures({"summary": summary, "requests": requests}, SLO(2000, 100))
    assert (row["late_ttft"], row["late_tpot"]) == (1, 1)
    assert (row["sent"], row["answered"], row["refused"], row["failed"]) == (6, 3, 2, 1)
    assert row["refusal_p50_ms"] == pytest.approx(5.0) and row["refusal_max_ms"] == pytest.approx(
        6.0)
    # interpolated between 50, 50 and 200 ms
    assert row["tpot_p99_ms"] == pytest.approx(50 + 0.98 * 150)


def test_verdict_compares_goodput_at_3x_with_1x():
    rows = [dict(load="1x", admission="on", goodput_rps=2.0, ttft_p99_ms=300.0, tpot_p99_ms=70.0,
                 refusal_p99_ms=None),
            dict(load="3x", admission="on", goodput_rps=1.9, ttft_p99_ms=310.0, tpot_p99_ms=75.0,
                 refusal_p99_ms=4.0)]
    assert verdict(rows, SLO(2000, 100))[0].startswith("goodput 3x/1x with admission on: 95%")
