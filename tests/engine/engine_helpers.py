"""Shared by the engine tests: deterministic prompts and a one-call greedy run."""
from __future__ import annotations

import random

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine


def random_prompts(n: int, vocab_size: int, seed: int = 0, min_len: int = 4, max_len: int = 100,
                   avoid: frozenset[int] = frozenset()) -> list[list[int]]:
    rng = random.Random(seed)
    allowed = [t for t in range(vocab_size) if t not in avoid]
    return [[rng.choice(allowed) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)]


def greedy(model_dir: str, prompts: list[list[int]], max_tokens: int = 32,
           **engine_kwargs) -> tuple[list[list[int]], LLMEngine]:
    engine = LLMEngine(EngineConfig(model=str(model_dir), **engine_kwargs))
    outs = engine.generate(prompts,
                           SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    return [o.token_ids for o in outs], engine
