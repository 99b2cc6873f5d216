"""The engine's output must not depend on how work is batched, chunked, cached or preempted."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.metrics import EngineCollector
from tests.engine.engine_helpers import greedy, random_prompts

NUM_PROMPTS = 64
SETTINGS = {
    "no-prefix-cache": dict(enable_prefix_caching=False),
    "chunk-16": dict(max_num_batched_tokens=16),
    "chunk-64": dict(max_num_batched_tokens=64),
    "chunk-4096": dict(max_num_batched_tokens=4096),
    "block-32": dict(block_size=32),
    "no-chunked-prefill": dict(enable_chunked_prefill=False, max_num_batched_tokens=4096),
}


@pytest.fixture(scope="module")
def llama(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="module")
def prompts():
    # Repeat some prefixes so that the prefix cache is really exercised.
    base = random_prompts(NUM_PROMPTS // 2, vocab_size=500, seed=1)
    return base + [
        p[:max(1,
               len(p) // 2)] + q
        for p, q in zip(base, random_prompts(NUM_PROMPTS // 2, 500, seed=2))
    ]


@pytest.fixture(scope="module")
def baseline(llama, prompts):
    tokens, engine = greedy(llama, prompts)
    assert engine.scheduler.stats.prefix_cache_hits > 0
    return tokens


@pytest.mark.parametrize("name", list(SETTINGS))
def test_outputs_identical_across_settings(llama, prompts, baseline, name):
    tokens, _ = greedy(llama, prompts, **SETTINGS[name])
    assert tokens == baseline


def test_one_request_alone_matches_batched(llama, prompts, baseline):
    # One engine, one request at a time: each runs alone in its batch (the first 16 prompts share
    # no prefix, so none reuses another's cached blocks either).
    first, engine = greedy(llama, prompts[:1])
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    alone = first + [engine.generate([p], params)[0].token_ids for p in prompts[1:16]]
    assert engine.scheduler.stats.prefix_cache_hits == 0
    assert alone == baseline[:16]


def test_preemption_happens_and_changes_nothing(llama, prompts, baseline):
    # 24 blocks of 16 tokens hold only a few of these sequences at once, so the scheduler must
    # preempt.
    tokens, engine = greedy(llama, prompts, num_kv_blocks=24)
    assert tokens == baseline
    assert engine.scheduler.stats.preemptions > 0
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))
    scrape = generate_latest(registry).decode()
    line = next(l for l in scrape.splitlines() if l.startswith("baton_num_preemptions_total"))
    assert float(line.split()[-1]) == engine.scheduler.stats.preemptions
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def test_abort_mid_flight_returns_blocks(llama, prompts):
    _, engine = greedy(llama, prompts[:1], max_tokens=1)
    for i, p in enumerate(prompts[:8]):
        engine.add_request(f"r{i}", p,
                           SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert engine.blocks.num_free_blocks < engine.blocks.num_blocks
    outs = [engine.abort_request(f"r{i}") for i in range(8)]
    assert all(o.finished and o.finish_reason == "abort" for o in outs)
    assert not engine.has_unfinished_requests()
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    assert engine.abort_request("r0") is None
