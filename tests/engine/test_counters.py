"""The engine's own prefill rate, which workers report and the router predicts queue waits from."""
from __future__ import annotations

import pytest

from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.sampling_params import SamplingParams


def test_prefill_rate_counts_only_steps_that_computed_prompt_tokens(tiny_model_dirs):
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dirs["llama"]), engine="sim", max_num_batched_tokens=256))
    assert engine.counters.prefill_tokens_per_s() is None
    prompts = [list(range(10, 110)), list(range(200, 500))]  # 400 prompt tokens: two steps at 256 per step
    engine.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    steps = list(engine.counters.recent_prefill_steps)
    assert [tokens for tokens, _ in steps] == [256, 144]
    assert engine.counters.steps == 2 + 7  # and seven decode-only steps, which it leaves out
    rate = engine.counters.prefill_tokens_per_s()
    assert rate == pytest.approx(400 / sum(seconds for _, seconds in steps))
