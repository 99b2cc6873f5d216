"""The simulated engine (engine=sim): real scheduler and prefix cache, deterministic tokens,
modelled time; and a trace replay on it, where prefix-aware routing must beat round-robin on cache
hits."""
from __future__ import annotations

import pytest

from baton.loadtest.sim.replay import Replay, build_requests, unlimited_cache_hit_ratio
from baton.loadtest.sim.runner import SimulatedRunner
from baton.loadtest.traces import TraceRequest
from baton.loadtest.workloads import token_pool
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.router.config import RouterConfig


@pytest.fixture(scope="module")
def sim_config(tiny_model_dirs) -> EngineConfig:
    return EngineConfig(engine="sim", model=str(tiny_model_dirs["llama"]), num_kv_blocks=64,
                        sim_step_base_seconds=0.0, sim_decode_seconds_per_sequence=0.0)


def test_sim_engine_is_deterministic_and_caches_prefixes(sim_config):
    engine = LLMEngine(sim_config, sim_runner=SimulatedRunner)
    assert isinstance(engine.runner, SimulatedRunner) and engine.runner.num_blocks == 64
    engine.blocks.record_events = True
    prompt = list(range(5, 105))
    greedy, sampled = engine.generate([prompt, prompt], [
        SamplingParams(max_tokens=12, temperature=0.0),
        SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    ])
    # The logits pin each token, so sampling at any temperature gives the greedy answer; EOS is
    # never emitted.
    assert greedy.token_ids == sampled.token_ids and len(greedy.token_ids) == 12
    assert not set(greedy.token_ids) & engine.eos_ids
    again = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=0.0))[0]
    # 6 full blocks of 16
    assert again.token_ids == greedy.token_ids and again.num_cached_tokens == 96
    assert any(kind == "stored" for kind, _ in engine.blocks.events)


def test_the_sim_engine_takes_its_runner_from_the_caller(sim_config):
    with pytest.raises(ValueError, match="engine=sim needs a sim_runner"):
        LLMEngine(sim_config)


def test_sim_cost_model_terms(sim_config):
    config = sim_config.model_copy(
        update=dict(sim_step_base_seconds=0.001, sim_prefill_tokens_per_second=1000.0,
                    sim_decode_seconds_per_sequence=0.01))
    engine = LLMEngine(config, sim_runner=SimulatedRunner)
    engine.runner.sleep = lambda seconds: None
    engine.add_request("a", list(range(5, 105)), SamplingParams(max_tokens=2))
    engine.step()  # the whole 100-token prompt in one chunk
    assert engine.runner.last_step_seconds == pytest.approx(0.001 + 100 / 1000)
    engine.step()  # one decode row
    assert engine.runner.last_step_seconds == pytest.approx(0.001 + 0.01)


def test_prefix_routing_beats_round_robin_on_a_shared_prefix_replay(sim_config):
    # Ten conversations of growing turns, interleaved: each turn repeats its conversation's history.
    rows = [
        TraceRequest(t * 0.05, 512 * 16 * (turn + 1), 512,
                     tuple(range(c * 100, c * 100 + 16 * (turn + 1))))
        for t, (turn, c) in enumerate((turn, c) for turn in range(4) for c in range(10))
    ]
    pool = token_pool(512, {0, 1, 2})
    requests = build_requests(rows, pool, scale=32, speedup=1.0, max_len=2048)
    bound = unlimited_cache_hit_ratio(requests, 16)
    results = {
        policy: Replay(policy, sim_config.model_copy(update=dict(num_kv_blocks=512)),
                       RouterConfig(), 4, ttft_slo_s=1.0).run(requests)
        for policy in ("prefix", "round-robin")
    }
    assert all(r.requests == 40 and r.rejected == 0 for r in results.values())
    assert results["prefix"].hit_ratio >= 0.8 * bound
    assert results["prefix"].hit_ratio > 1.5 * results["round-robin"].hit_ratio
