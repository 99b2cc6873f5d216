"""Speculation with EAGLE and EAGLE-3 heads in their published format: greedy outputs are those
without speculation, every draft is the head's own (a float64 reference from scratch), a head that
agrees with its target has its drafts accepted, through skipped steps, preemption, a KV hand-off
and sampling."""
from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.kv.layout import order_of
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.metrics import EngineCollector
from tests.engine.eagle_helpers import agreeing_head, bigram_target, make_head
from tests.engine.eagle_reference import EagleReference
from tests.engine.engine_helpers import random_prompts
from tests.engine.test_handoff import handoff
from tests.engine.test_speculation_draft import (DraftRecorder, assert_all_blocks_free, run,
                                                 staggered)

K = 3
METHODS = ("eagle", "eagle3")
RANDOM = (("eagle", "llama"), ("eagle3", "qwen2"))
# Noise on the agreeing heads' weights under which about a third of the drafts are accepted.
NOISE = {"eagle": 0.002, "eagle3": 0.005}


def eagle_config(method: str, head, **extra) -> str:
    return json.dumps({"method": method, "model": str(head), "num_speculative_tokens": K,
                       **extra})


@pytest.fixture(scope="module")
def heads(tiny_model_dirs, tmp_path_factory):
    """Random heads: EAGLE-1 for Llama, EAGLE-3 for Qwen2 (whose embeddings are tied)."""
    root = tmp_path_factory.mktemp("eagle-heads")
    return {(m, arch): make_head(tiny_model_dirs[arch], root / f"{m}-{arch}", m == "eagle3")
            for m, arch in RANDOM}


@pytest.fixture(scope="module")
def agreeing(tiny_model_dirs, tmp_path_factory):
    """(target, head, head with noise) per method, the head drafting exactly what the target
    decodes and the noisy one some of it."""
    root = tmp_path_factory.mktemp("eagle-agree")
    llama = tiny_model_dirs["llama"]
    out = {}
    for method, repeat in (("eagle", False), ("eagle3", True)):
        target = bigram_target(llama, root / f"target-{method}", repeat=repeat)
        eagle3 = method == "eagle3"
        out[method] = (target, agreeing_head(target, root / f"head-{method}", eagle3),
                       agreeing_head(target, root / f"noisy-{method}", eagle3, NOISE[method]))
    return out


@pytest.fixture(scope="module")
def prompts():
    # Even last tokens: the agreeing EAGLE-3 head's draft vocabulary has the even tokens.
    return [p[:-1] + [p[-1] // 2 * 2]
            for p in random_prompts(4, vocab_size=500, seed=5, min_len=8, max_len=40)]


def greedy_against_reference(model, head, method, prompts) -> LLMEngine:
    """Runs prompts staggered (with steps that do not speculate) with and without the head and
    checks the outputs are the same, and that each of a share of the drafts is the head's greedy
    continuation of what the sequence held then, computed from scratch: the head's KV, caught up
    over prompts, skipped steps and accepted tokens and rolled back after rejections, is right."""
    plain = staggered(LLMEngine(EngineConfig(model=str(model), num_kv_blocks=256,
                                             block_size=4)), prompts)
    spec = eagle_config(method, head, disable_by_batch_size=2)
    engine = LLMEngine(EngineConfig(model=str(model), num_kv_blocks=256, block_size=4,
                                    speculative_config=spec))
    recorder = engine.speculator.proposer = DraftRecorder(engine.speculator.proposer)
    got = staggered(engine, prompts)
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]
    for a, b in zip(got, plain):
        assert [lp.logprob for lp in a.logprobs or []] == pytest.approx(
            [lp.logprob for lp in b.logprobs or []], abs=1e-4)
    assert_all_blocks_free(engine)
    full = [(ctx, d) for ctx, d in recorder.drafts if len(d) == K]
    assert len(full) > 10
    reference = EagleReference(model, head, method == "eagle3")
    assert [d for _, d in full[::4]] == [reference.drafts(ctx, K) for ctx, _ in full[::4]]
    return engine


@pytest.mark.parametrize("method, arch", RANDOM)
def test_greedy_with_a_head_equals_no_speculation(tiny_model_dirs, heads, prompts, method, arch):
    greedy_against_reference(tiny_model_dirs[arch], heads[method, arch], method, prompts)


@pytest.mark.parametrize("method", METHODS)
def test_a_head_that_agrees_in_part_rolls_back(agreeing, prompts, method):
    target, _, noisy = agreeing[method]
    stats = greedy_against_reference(target, noisy, method, prompts).speculator.stats
    assert stats.accepted_per_pos[-1] > 0 and 0.1 < stats.acceptance_rate < 0.9


# The head's cache is head-major too with --kv-cache-layout HND.
@pytest.mark.parametrize("method, layout", [("eagle", "NHD"), ("eagle3", "NHD"), ("eagle", "HND")])
def test_a_head_that_agrees_has_its_drafts_accepted(agreeing, prompts, method, layout):
    target, head, _ = agreeing[method]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain, _ = run(target, prompts, params)
    got, engine = run(target, prompts, params, eagle_config(method, head),
                      kv_cache_layout=layout)
    assert order_of(engine.speculator.proposer.runner.kv_cache) == layout
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]
    stats = engine.speculator.stats
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))
    assert registry.get_sample_value("baton_spec_decode_num_accepted_tokens_total",
                                     {"model_name": target.name}) == stats.num_accepted_tokens


def test_preemption_with_a_head_changes_nothing(agreeing, prompts):
    target, head, _ = agreeing["eagle"]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain, _ = run(target, prompts, params)
    got, engine = run(target, prompts, params, eagle_config("eagle", head), num_kv_blocks=30)
    assert engine.scheduler.stats.preemptions > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]
    # The target recomputes a preempted sequence and the head catches up with it again.
    assert engine.speculator.stats.acceptance_rate >= 0.9
    assert_all_blocks_free(engine)


def test_sampled_drafts_keep_their_lengths_and_logprobs(tiny_model_dirs, heads, prompts):
    params = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True, logprobs=1)
    got, engine = run(tiny_model_dirs["qwen2"], prompts, params,
                      eagle_config("eagle3", heads["eagle3", "qwen2"]))
    assert all(len(o.token_ids) == 16 and len(o.logprobs) == 16 for o in got)
    assert all(lp.token_id == t for o in got for lp, t in zip(o.logprobs, o.token_ids))
    assert engine.speculator.stats.num_drafts > 0
    assert_all_blocks_free(engine)


def test_decode_side_of_a_handoff_drafts_after_its_first_step(agreeing, prompts):
    """The prompt's KV comes by hand-off from an engine without the head: the head never sees its
    hidden states, and drafts from the decode side's own steps on (an agreeing EAGLE-1 head needs
    only the latest token). With the head on both ends: test_eagle_handoff.py."""
    target, head, _ = agreeing["eagle"]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    colocated, _ = run(target, prompts, params)
    prefill = LLMEngine(EngineConfig(model=str(target), num_kv_blocks=256, block_size=4))
    decode = LLMEngine(EngineConfig(model=str(target), num_kv_blocks=256, block_size=4,
                                    speculative_config=eagle_config("eagle", head)))
    got = [handoff(prefill, decode, f"r{i}", p, params) for i, p in enumerate(prompts)]
    assert got == [o.token_ids for o in colocated]
    assert decode.speculator.stats.num_accepted_tokens > 0
    for engine in (prefill, decode):
        assert_all_blocks_free(engine)
