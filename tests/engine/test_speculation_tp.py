"""Speculation at tensor parallelism 2 on CPU (gloo): greedy outputs with n-gram drafts, and with a
draft model that rank 0 runs alone, are TP=1's without speculation token for token, and
transformers'; drafts accepted in full, in part and not at all, so blocks grown for a draft are
trimmed on every rank and rejected positions' KV overwritten; with a cache small enough that
sequences are preempted and their tables resent."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.parallel.step_sync import StepDecoder, StepEncoder
from baton.services.engine.sequence import Status
from tests.engine.draft_helpers import perturbed_copy
from tests.engine.engine_helpers import random_prompts
from tests.engine.lora_helpers import assert_matches, greedy_reference, reference_model
from tests.engine.test_speculation import OracleProposer

MAX_TOKENS = 16
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                    "prompt_lookup_max": 3})
ENGINE = dict(dtype="float32", device="cpu", max_model_len=256, num_threads=1, block_size=4)
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    base = random_prompts(3, vocab_size=500, seed=11, min_len=8, max_len=30)
    # Prompts that repeat themselves give the n-gram proposer drafts that are accepted.
    return base + [p + p[:len(p) // 2] for p in base[:2]]


@pytest.fixture(scope="module")
def reference(tiny_model_dirs, prompts) -> list:
    """TP=1 without speculation."""
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=256,
                                    **ENGINE))
    try:
        return engine.generate(prompts, GREEDY)
    finally:
        engine.close()


def _speculate(model, prompts, spec: str, oracle=None, **kwargs) -> tuple[list, object]:
    engine = LLMEngine(EngineConfig(model=str(model), speculative_config=spec,
                                    tensor_parallel_size=2, **{**ENGINE, **kwargs}))
    if oracle is not None:
        engine.speculator.proposer = oracle
    try:
        return engine.generate(prompts, GREEDY), engine
    finally:
        engine.close()


def _assert_same(got: list, want: list) -> None:
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for a, b in zip(got, want):
        assert [lp.token_id for lp in a.logprobs] == [lp.token_id for lp in b.logprobs]
        assert [lp.logprob for lp in a.logprobs] == pytest.approx(
            [lp.logprob for lp in b.logprobs], abs=1e-4)


def test_tp2_ngram_equals_tp1_and_transformers(tiny_model_dirs, prompts, reference):
    model = tiny_model_dirs["llama"]
    got, engine = _speculate(model, prompts, NGRAM, num_kv_blocks=256)
    _assert_same(got, reference)
    stats = engine.speculator.stats
    assert stats.num_drafts > 0 and stats.num_draft_tokens > sum(stats.accepted_per_pos)
    hf = reference_model(model, None)
    for i, (prompt, out) in enumerate(zip(prompts, got)):
        want, gaps = greedy_reference(hf, prompt, MAX_TOKENS)
        assert_matches(out.token_ids, want, gaps, f"prompt {i} at TP=2 with n-gram drafts")


def test_tp2_drafts_accepted_in_full_in_part_and_not(tiny_model_dirs, prompts, reference):
    """The tiny random model rarely continues an n-gram, so an oracle drafts TP=1's answer,
    spoiled at the first or second token of two drafts in three; in a cache small enough that
    sequences are preempted."""
    oracle = OracleProposer([list(p) + list(o.token_ids) for p, o in zip(prompts, reference)])
    got, engine = _speculate(tiny_model_dirs["llama"], prompts, NGRAM, oracle, num_kv_blocks=20)
    _assert_same(got, reference)
    stats = engine.speculator.stats
    assert stats.accepted_per_pos[-1] > 0  # some drafts accepted in full
    assert 0 < sum(stats.accepted_per_pos) < stats.num_draft_tokens
    assert engine.scheduler.stats.preemptions > 0


def test_tp2_draft_model_on_rank0_equals_tp1(tiny_model_dirs, prompts, reference,
                                             tmp_path_factory):
    model = tiny_model_dirs["llama"]
    draft = perturbed_copy(model, tmp_path_factory.mktemp("draft") / "llama", 0.03)
    spec = json.dumps({"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3})
    got, engine = _speculate(model, prompts, spec, num_kv_blocks=256)
    _assert_same(got, reference)
    stats = engine.speculator.stats
    assert 0 < sum(stats.accepted_per_pos) < stats.num_draft_tokens
    # The draft is whole on rank 0: every KV head and the whole vocabulary.
    draft_runner = engine.speculator.proposer.runner
    assert draft_runner.executor is None
    assert draft_runner.kv_cache.shape[4] == engine.model_config.num_key_value_heads
    assert engine.runner.kv_cache.shape[4] == engine.model_config.num_key_value_heads // 2


def test_step_messages_carry_drafts_and_trim_tables_in_place() -> None:
    """A draft's blocks grow the table and a rejection trims it: the other ranks' table follows by
    deltas (no resend), and their items run the draft's positions."""
    seq = SimpleNamespace(status=Status.RUNNING, block_ids=[7], lora_slot=None,
                          num_computed_tokens=3, token_ids=[1, 2, 3, 4])
    encoder, decoder = StepEncoder(), StepDecoder()
    seq.block_ids = [7, 9, 4]  # grown for a draft of 5 tokens past position 3, block size 4
    message = encoder.encode([SimpleNamespace(seq=seq, num_tokens=1, samples=True,
                                              draft=[5, 6, 7, 8, 9])], [])
    [item] = decoder.decode(message)
    assert (item.draft, item.num_positions, item.seq.block_ids) == ([5, 6, 7, 8, 9], 6, [7, 9, 4])
    seq.block_ids, seq.num_computed_tokens, seq.token_ids = [7, 9], 5, [1, 2, 3, 4, 5, 10]
    message = encoder.encode([SimpleNamespace(seq=seq, num_tokens=1, samples=True, draft=[])], [])
    assert (message.seqs[0].keep_blocks, message.seqs[0].new_blocks) == (2, [])
    [item] = decoder.decode(message)
    assert (item.draft, item.num_positions, item.seq.block_ids) == ([], 1, [7, 9])
    assert item.seq.token_ids[5:6] == [10]

