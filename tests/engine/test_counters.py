"""The engine's own prefill rate, which workers report and the router predicts queue waits from."""
from __future__ import annotations

import pytest

from baton.loadtest.sim.runner import SimulatedRunner
from baton.services.common.decode_cost import DecodeCostModel
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine


def test_prefill_rate_counts_only_steps_that_computed_prompt_tokens(tiny_model_dirs):
    config = EngineConfig(model=str(tiny_model_dirs["llama"]), engine="sim",
                          max_num_batched_tokens=256)
    engine = LLMEngine(config, sim_runner=SimulatedRunner)
    assert engine.counters.prefill_tokens_per_s() is None
    # 400 prompt tokens: two steps at 256 per step
    prompts = [list(range(10, 110)), list(range(200, 500))]
    engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    steps = list(engine.counters.recent_prefill_steps)
    assert [tokens for tokens, _ in steps] == [256, 144]
    assert engine.counters.steps == 2 + 7  # and seven decode-only steps, which it leaves out
    rate = engine.counters.prefill_tokens_per_s()
    assert rate == pytest.approx(400 / sum(seconds for _, seconds in steps))


def test_decode_cost_fit_recovers_a_linear_cost_and_falls_back_when_it_cannot():
    model = DecodeCostModel()
    assert model.fit() is None
    for rows in (1, 4, 9, 16, 25, 3, 12):
        # not proportional to rows, so both slopes are identifiable
        context = rows * (300 + 7 * rows)
        model.record(rows, context, 0.005 + 0.0004 * rows + 2e-6 * context)
    fit = model.fit()
    assert (fit.base_s, fit.per_sequence_s, fit.per_token_s) == pytest.approx((0.005, 0.0004, 2e-6),
                                                                              rel=1e-6)
    assert fit.samples == 7
    # Step times that fall as the batch grows fit no cost with non-negative slopes: proportional to
    # rows.
    falling = DecodeCostModel()
    for rows, seconds in ((1, 0.04), (2, 0.03), (4, 0.02), (8, 0.01)):
        falling.record(rows, rows * 100, seconds)
    fit = falling.fit()
    assert (fit.base_s, fit.per_token_s) == (0.0, 0.0) and fit.per_sequence_s == pytest.approx(
        0.1 / 15)


def test_tokens_per_row_step_turn_the_step_cost_into_tpot():
    model = DecodeCostModel()
    for rows in (1, 2, 3, 4):  # speculation: three tokens a row a step
        model.record(rows, rows * 10, 0.01 * rows, tokens=3 * rows)
    fit = model.fit()
    assert fit.tokens_per_row_step == pytest.approx(3.0)
    assert fit.tpot_s(2, 20) == pytest.approx(fit.step_s(2, 20) / 3)
    plain = DecodeCostModel()
    for rows in (1, 2, 3, 4):
        plain.record(rows, rows * 10, 0.01 * rows)
    assert plain.fit().tokens_per_row_step == 1.0


def test_engine_records_decode_steps_with_their_batch(tiny_model_dirs):
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dirs["llama"]), engine="sim"),
                       sim_runner=SimulatedRunner)
    engine.generate([list(range(10, 50)), list(range(60, 80))],
                    SamplingParams(max_tokens=6, ignore_eos=True))
    samples = list(engine.counters.decode_cost._samples)
    # One prefill step for both prompts, then five steps of two rows; the context grows by one token
    # a row a step.
    assert [(rows, context, tokens) for rows, context, _, tokens in samples] == [
        (2, 62 + 2 * k, 2) for k in range(5)]
    assert engine.decode_load() == (0, 0)  # all finished
