"""Speculation with a draft model: greedy outputs are those without it, the draft's own KV follows
each sequence through rejections, batch-size cutoffs, preemption and a KV hand-off, and a sampled
draft's distributions reach the rejection sampler."""
from __future__ import annotations

import json

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from tests.engine.draft_helpers import perturbed_copy
from tests.engine.engine_helpers import random_prompts
from tests.engine.test_handoff import handoff

K = 4
MAX_TOKENS = 24
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=2)
# Noise of 3% of each weight's spread: the draft agrees with its target on about 40% of tokens.
NOISE = 0.03


def draft_config(model, **extra) -> str:
    return json.dumps({"method": "draft_model", "model": str(model),
                       "num_speculative_tokens": K, **extra})


def run(model_dir, prompts, params, spec=None, **engine_kwargs):
    engine = LLMEngine(EngineConfig(model=str(model_dir), speculative_config=spec,
                                    **{"num_kv_blocks": 256, "block_size": 4, **engine_kwargs}))
    return engine.generate(prompts, params), engine


class DraftRecorder:
    """Wraps a proposer, keeping each greedy draft with the tokens it followed."""

    def __init__(self, proposer) -> None:
        self.proposer = proposer
        self.drafts: list[tuple[list[int], list[int]]] = []

    def draft(self, step, wanted):
        drafts = self.proposer.draft(step, wanted)
        self.drafts += [(list(item.seq.token_ids), d.tokens) for (item, _), d in zip(wanted, drafts)
                        if d.tokens]
        return drafts


@pytest.fixture(scope="module")
def drafts(tiny_model_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("drafts")
    return {arch: perturbed_copy(tiny_model_dirs[arch], root / arch, NOISE)
            for arch in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(4, vocab_size=500, seed=3, min_len=8, max_len=40)


def assert_all_blocks_free(engine: LLMEngine) -> None:
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def staggered(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    """Two long requests, then two short ones a few steps in: with disable_by_batch_size 2 the
    long ones draft, stop while the short ones run, and draft again after them."""
    long = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=2)
    short = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    done = {}
    for i, prompt in enumerate(prompts):
        if i == 2:
            for _ in range(4):
                done.update((o.request_id, o) for o in engine.step() if o.finished)
        engine.add_request(str(i), prompt, long if i < 2 else short)
    while engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    return [done[str(i)] for i in range(len(prompts))]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_with_a_draft_equals_no_speculation(tiny_model_dirs, drafts, prompts, arch):
    plain = staggered(LLMEngine(EngineConfig(model=str(tiny_model_dirs[arch]),
                                             num_kv_blocks=256, block_size=4)), prompts)
    spec = draft_config(drafts[arch], disable_by_batch_size=2)
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dirs[arch]), num_kv_blocks=256,
                                    block_size=4, speculative_config=spec))
    recorder = engine.speculator.proposer = DraftRecorder(engine.speculator.proposer)
    got = staggered(engine, prompts)
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]
    for a, b in zip(got, plain):
        assert [lp.logprob for lp in a.logprobs or []] == pytest.approx(
            [lp.logprob for lp in b.logprobs or []], abs=1e-4)
    stats = engine.speculator.stats
    # Drafts were accepted in part: rejected positions' draft KV was rolled back and rewritten.
    assert stats.accepted_per_pos[-1] > 0 and 0.1 < stats.acceptance_rate < 0.9
    assert_all_blocks_free(engine)
    # Every draft is the draft model's own greedy continuation of what the sequence held then:
    # the draft's KV, caught up after skipped steps and rolled back after rejections, is what a
    # fresh run computes.
    contexts = [tokens for tokens, _ in recorder.drafts]
    alone = LLMEngine(EngineConfig(model=str(drafts[arch]), num_kv_blocks=1024, block_size=4))
    fresh = alone.generate(contexts, [SamplingParams(max_tokens=len(d), temperature=0.0,
                                                     ignore_eos=True)
                                      for _, d in recorder.drafts])
    assert [o.token_ids for o in fresh] == [d for _, d in recorder.drafts]


def test_draft_equal_to_target_accepts_everything_across_skipped_steps(tiny_model_dirs, prompts):
    """With the target as its own draft, greedy drafts are all accepted; a step above
    disable_by_batch_size does not draft, and the draft's KV catches up afterwards."""
    model = tiny_model_dirs["llama"]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
              for n in (6, 12, 30, 40)]
    plain, _ = run(model, prompts, params)
    spec, engine = run(model, prompts, params, draft_config(model, disable_by_batch_size=2))
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    stats = engine.speculator.stats
    # Only the last two requests drafted, once the others were done: at most 18 + 28 tokens.
    assert 0 < stats.num_draft_tokens <= 46
    assert stats.acceptance_rate >= 0.95
    assert_all_blocks_free(engine)


def test_preemption_with_a_draft_changes_nothing(tiny_model_dirs, drafts, prompts):
    model = tiny_model_dirs["llama"]
    plain, _ = run(model, prompts, GREEDY)
    spec, engine = run(model, prompts, GREEDY, draft_config(drafts["llama"]), num_kv_blocks=30)
    assert engine.scheduler.stats.preemptions > 0
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert engine.speculator.stats.num_accepted_tokens > 0
    assert_all_blocks_free(engine)


def test_sampled_drafts_are_weighed_by_their_own_distribution(tiny_model_dirs, drafts, prompts):
    model = tiny_model_dirs["llama"]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, ignore_eos=True, logprobs=1)
    # The target as its own draft draws from the target's distribution: min(1, p/q) is 1, every
    # token accepted. Weighed as a deterministic draft (by p alone), most would be rejected.
    _, engine = run(model, prompts, params, draft_config(model))
    assert engine.speculator.stats.acceptance_rate >= 0.95
    got, engine = run(model, prompts, params, draft_config(drafts["llama"]))
    assert all(len(o.token_ids) == MAX_TOKENS and len(o.logprobs) == MAX_TOKENS for o in got)
    assert all(lp.token_id == t for o in got for lp, t in zip(o.logprobs, o.token_ids))
    assert engine.speculator.stats.num_accepted_tokens > 0
    assert_all_blocks_free(engine)


def test_decode_side_of_a_handoff_computes_the_drafts_prompt_kv(tiny_model_dirs, prompts):
    model = str(tiny_model_dirs["qwen2"])
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    colocated, _ = run(model, prompts, params)
    prefill = LLMEngine(EngineConfig(model=model, num_kv_blocks=256, block_size=4))
    decode = LLMEngine(EngineConfig(model=model, num_kv_blocks=256, block_size=4,
                                    speculative_config=draft_config(model)))
    got = [handoff(prefill, decode, f"r{i}", p, params) for i, p in enumerate(prompts)]
    assert got == [o.token_ids for o in colocated]
    # Only the target's KV came over: the draft computed the prompt's own on the decode side,
    # or its drafts would not all be accepted.
    assert decode.speculator.stats.acceptance_rate >= 0.95
    for engine in (prefill, decode):
        assert_all_blocks_free(engine)
