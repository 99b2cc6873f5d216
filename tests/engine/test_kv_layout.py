"""The head-major KV cache (--kv-cache-layout HND) on CPU: the engine's greedy outputs and its cache
contents equal the token-major (NHD) engine's, at TP=1 and TP=2, through chunked prefill, prefix
hits and decode; the cache is head-major in memory behind the same logical shape."""
from __future__ import annotations

import pytest
import torch

from baton.services.engine.kv.layout import KVLayout, byte_view, order_of, storage
from tests.engine.engine_helpers import greedy, random_prompts

MAX_TOKENS = 10
# A small step budget splits the longer prompts into chunks that attend to their cached prefix.
ENGINE = dict(dtype="float32", device="cpu", num_kv_blocks=48, max_model_len=256, num_threads=1,
              block_size=8, max_num_batched_tokens=32)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    shared = random_prompts(1, 250, seed=3, min_len=20, max_len=20)[0]
    # Two prompts share a 20-token prefix: the second reads the first's blocks from the cache.
    return [shared + [5, 6, 7], *random_prompts(2, 250, seed=11, min_len=5, max_len=45),
            shared + [9]]


@pytest.fixture(scope="module")
def reference(tiny_model_dirs, prompts):
    out, engine = greedy(str(tiny_model_dirs["llama"]), prompts, MAX_TOKENS, **ENGINE)
    try:
        yield out, engine.kv_cache.clone()
    finally:
        engine.close()


def test_hnd_engine_matches_nhd_token_for_token_and_in_its_cache(tiny_model_dirs, prompts,
                                                                 reference):
    out, engine = greedy(str(tiny_model_dirs["llama"]), prompts, MAX_TOKENS, **ENGINE,
                         kv_cache_layout="HND")
    try:
        cache = engine.kv_cache
        assert order_of(cache) == "HND" and KVLayout.of(cache).order == "HND"
        assert storage(cache).is_contiguous() and storage(cache).shape[3:5] == (2, 8)
        assert out == reference[0]
        assert torch.equal(cache, reference[1])
        # Whole (layer, block) ranges stay contiguous: one block's bytes are its heads in turn.
        block = byte_view(cache)[0, 1].view(torch.float32).view(2, 2, 8, -1)
        assert torch.equal(block, cache[0, 1].transpose(1, 2))
    finally:
        engine.close()


def test_hnd_engine_at_tp2_matches_nhd_at_tp1(tiny_model_dirs, prompts, reference):
    out, engine = greedy(str(tiny_model_dirs["llama"]), prompts, MAX_TOKENS, **ENGINE,
                         kv_cache_layout="HND", tensor_parallel_size=2)
    try:
        assert out == reference[0]
    finally:
        engine.close()
