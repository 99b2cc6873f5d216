"""Shared by the KV-tier tests: a device cache far smaller than the work, conversations that come
back after other traffic evicted them, and greedy runs to compare."""
from __future__ import annotations

import random

from baton.services.common.block_hash import block_hashes
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine

GIB = 1 << 30
BLOCK_SIZE = 4
DEVICE_BLOCKS = 40  # 160 tokens: far less than the conversations' KV
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def conversations(n: int = 8, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 250) for _ in range(rng.randint(30, 70))] for _ in range(n)]


def engine(**kwargs: object) -> LLMEngine:
    settings = {"block_size": BLOCK_SIZE, "num_kv_blocks": DEVICE_BLOCKS, "max_num_seqs": 4}
    settings.update(kwargs)
    return LLMEngine(EngineConfig(**settings))


def two_turns(e: LLMEngine, prompts: list[list[int]],
              params: SamplingParams = GREEDY) -> tuple[list[list[int]], list[int]]:
    """Each conversation's first turn, then (all of them done) its second: the first turn's prompt
    and answer plus a new message. Returns every turn's output tokens, and the second turns' cached
    token counts."""
    first = e.generate(prompts, params)
    if e.tiers is not None:
        assert e.tiers.flush()  # the first turns' blocks are in their tiers before the second
    second = e.generate(follow_ups(prompts, [o.token_ids for o in first]), params)
    return ([o.token_ids for o in first + second], [o.num_cached_tokens for o in second])


def follow_ups(prompts: list[list[int]], answers: list[list[int]]) -> list[list[int]]:
    """Each conversation's second turn: its first prompt and answer plus a new message."""
    rng = random.Random(1)
    return [p + a + [rng.randrange(5, 250) for _ in range(6)] for p, a in zip(prompts, answers)]


def gib_for(e: LLMEngine, blocks: int) -> float:
    """A tier setting that holds this many blocks of e's cache."""
    cache = e.runner.kv_cache
    return blocks * cache[:, 0].numel() * cache.element_size() / GIB


def all_hashes(e: LLMEngine, sequences: list[list[int]]) -> set[int]:
    return {h for s in sequences for h in block_hashes(s, BLOCK_SIZE, e.model_id)}
