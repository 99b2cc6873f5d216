"""`baton loadtest-compare` on two small sweeps: one table row per rate and system, and the
figure."""
from __future__ import annotations

import json

import pytest

from baton.loadtest.stats import OK, SLO, RequestResult, summarize
from baton.services.cli.main import main


def sweep(ttft_s: float) -> dict:
    points = []
    for rate in (1.0, 2.0):
        results = [
            RequestResult(i, OK, ttft_s=ttft_s * rate, e2e_s=1.0, itls_s=[0.01] * 9,
                          output_tokens=10) for i in range(10)
        ]
        points.append({"rate": rate, "summary": summarize(results, 10.0, SLO(ttft_ms=300))})
    return {"points": points, "distserve_goodput_rps": 1.0}


def test_compare_prints_each_system_at_each_rate_and_draws_the_figure(tmp_path, capsys):
    (tmp_path / "a.json").write_text(json.dumps(sweep(0.1)))
    (tmp_path / "b.json").write_text(json.dumps(sweep(0.2)))
    assert main(["loadtest-compare", f"fast={tmp_path / 'a.json'}", f"slow={tmp_path / 'b.json'}",
                 "--plots", str(tmp_path)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 |")]
    assert [row.split(" | ")[1] for row in rows] == ["fast", "slow"]
    assert "| 200.00 |" in rows[0] and "| 400.00 |" in rows[1]  # TTFT p90 ms
    assert "| 1.00 | 1.00 |" in rows[0] and "| 0.00 | 0.00 |" in rows[1]  # goodput and attainment
    assert (tmp_path / "comparison.png").stat().st_size > 0


def test_compare_refuses_a_file_without_a_sweep(tmp_path):
    (tmp_path / "single.json").write_text(json.dumps({"summary": {}}))
    with pytest.raises(SystemExit, match="no sweep"):
        main(["loadtest-compare", f"x={tmp_path / 'single.json'}"])
