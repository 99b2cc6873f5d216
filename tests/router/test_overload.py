"""Overload in virtual time (loadtest/sim/overload.py): at 3x capacity, admission control keeps
goodput near the 1x level by refusing at once, while without it the queue makes nearly every
request late."""
from __future__ import annotations

import pytest
from baton.loadtest.sim.overload import OverloadCase, run_case
from baton.services.checkpoints.tiny_model import embedded_model_path
from baton.services.engine.config import EngineConfig

SLO_S = 0.5


@pytest.fixture(scope="module")
def engine_config() -> EngineConfig:
    return EngineConfig(engine="sim", model=str(embedded_model_path()), num_kv_blocks=4096)


def _run(engine_config: EngineConfig, load: float, admission: bool) -> dict:
    return run_case(OverloadCase(load, admission), engine_config, workers=2, prompt_len=1024,
                    max_tokens=16, seconds=3.0, slo_s=SLO_S, seed=1)


def test_admission_holds_goodput_at_three_times_capacity(engine_config):
    base = _run(engine_config, 1.0, True)
    on = _run(engine_config, 3.0, True)
    off = _run(engine_config, 3.0, False)
    assert on["refused"] > on["requests"] / 2  # two thirds of 3x cannot be served
    assert on["goodput_rps"] >= 0.9 * base["goodput_rps"]
    assert on["ttft_p99_ms"] <= SLO_S * 1e3
    assert on["refusal_p99_ms"] <= 50  # refused at arrival, not after waiting in the queue
    assert off["refused"] == 0 and off["goodput_rps"] < 0.5 * on["goodput_rps"]
