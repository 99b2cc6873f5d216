"""2,000 requests of mixed lengths inside a fixed KV budget: all complete, blocks all return, RSS
plateaus."""
from __future__ import annotations

import random

import psutil

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine

TOTAL = 2000
IN_FLIGHT = 64
# Allocator noise on CPython and glibc; a real leak of per-request state would add far more over
# 1,500 requests.
ALLOWED_GROWTH = 24 << 20


def test_no_leak_over_2000_requests(tiny_model_dirs):
    engine = LLMEngine(
        EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=96, max_num_seqs=64))
    rng = random.Random(0)
    process = psutil.Process()
    submitted = finished = 0
    rss_at: dict[int, int] = {}
    while finished < TOTAL:
        while submitted < TOTAL and submitted - finished < IN_FLIGHT:
            prompt = [rng.randrange(1, 500) for _ in range(rng.choice([3, 20, 90, 200]))]
            params = SamplingParams(max_tokens=rng.randint(1, 24),
                                    temperature=rng.choice([0.0, 0.8]), seed=rng.choice([None, 7]),
                                    stop=rng.choice([[], ["the"]]), logprobs=rng.choice([None, 2]))
            engine.add_request(f"r{submitted}", prompt, params)
            submitted += 1
        for out in engine.step():
            if out.finished:
                finished += 1
                if finished % 250 == 0:
                    rss_at[finished] = process.memory_info().rss
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    assert not engine.seqs and not engine.detokenizers
    growth = rss_at[TOTAL] - rss_at[500]
    print({k: v >> 20 for k, v in rss_at.items()}, "MiB")
    assert growth < ALLOWED_GROWTH, f"RSS grew {growth >> 20} MiB between request 500 and {TOTAL}"
