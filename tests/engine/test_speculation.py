"""Speculative decoding in the engine: greedy outputs, stops, logprobs, preemption and the prefix
cache are what they are without it, drafts accepted or not."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.metrics import EngineCollector
from baton.services.engine.speculation.proposer import SequenceProposer
from tests.engine.engine_helpers import random_prompts

NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, ' \
        '"prompt_lookup_max": 3}'
MAX_TOKENS = 32


class OracleProposer(SequenceProposer):
    """Drafts the reference continuation, wrong at every third draft's second token: drafts are
    then fully accepted, partly accepted and rejected at their first token, in turn."""

    def __init__(self, references: list[list[int]]) -> None:
        self.references = references
        self.calls = 0

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        for ref in self.references:
            if ref[:len(token_ids)] == token_ids:
                draft = list(ref[len(token_ids):len(token_ids) + k])
                self.calls += 1
                if self.calls % 3 == 0 and len(draft) > 1:
                    draft[1] = (draft[1] + 1) % 500
                elif self.calls % 3 == 1 and draft:
                    draft[0] = (draft[0] + 7) % 500
                return draft
        return []


def run(model_dir, prompts, params, spec=None, oracle=None, **engine_kwargs):
    engine = LLMEngine(EngineConfig(model=str(model_dir), speculative_config=spec,
                                    **{"num_kv_blocks": 256, **engine_kwargs}))
    if oracle is not None:
        engine.speculator.proposer = oracle
    return engine.generate(prompts, params), engine


@pytest.fixture(scope="module")
def prompts():
    base = random_prompts(4, vocab_size=500, seed=3, min_len=8, max_len=40)
    # Prompts that repeat themselves give the n-gram proposer something to find.
    return base + [p + p[:len(p) // 2] for p in base[:2]]


GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=2)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_ngram_equals_no_speculation(tiny_model_dirs, prompts, arch):
    plain, _ = run(tiny_model_dirs[arch], prompts, GREEDY, block_size=4)
    spec, engine = run(tiny_model_dirs[arch], prompts, GREEDY, NGRAM, block_size=4)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    for a, b in zip(spec, plain):
        assert [lp.token_id for lp in a.logprobs] == [lp.token_id for lp in b.logprobs]
        assert [lp.logprob for lp in a.logprobs] == pytest.approx(
            [lp.logprob for lp in b.logprobs], abs=1e-4)
    stats = engine.speculator.stats
    assert stats.num_drafts > 0 and stats.num_draft_tokens >= stats.num_drafts


def test_accepted_drafts_keep_outputs_blocks_and_cache(tiny_model_dirs, prompts):
    model = tiny_model_dirs["llama"]
    plain, base_engine = run(model, prompts, GREEDY, block_size=4)
    oracle = OracleProposer([list(p) + list(o.token_ids) for p, o in zip(prompts, plain)])
    spec, engine = run(model, prompts, GREEDY, NGRAM, oracle, block_size=4)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    stats = engine.speculator.stats
    # Every kind of verdict happened: full, partial and none.
    assert stats.accepted_per_pos[-1] > 0
    assert stats.num_drafts > stats.accepted_per_pos[0] > stats.accepted_per_pos[-1]
    assert stats.num_accepted_tokens < stats.num_draft_tokens
    assert engine.counters.steps < base_engine.counters.steps
    # What the router's TPOT predictor divides the step cost by.
    assert engine.counters.decode_cost.fit().tokens_per_row_step > 1.0
    assert base_engine.counters.decode_cost.fit().tokens_per_row_step == 1.0
    # Rejected positions gave their blocks back, and the cache holds the same blocks as without
    # speculation: only accepted tokens were hashed.
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    assert set(engine.blocks.cached) == set(base_engine.blocks.cached)


def test_stops_and_max_tokens_cut_inside_a_draft(tiny_model_dirs, prompts):
    model = tiny_model_dirs["llama"]
    plain, _ = run(model, prompts, GREEDY, block_size=4)
    refs = [list(p) + list(o.token_ids) for p, o in zip(prompts, plain)]
    # Stop on a token met mid-way; stop early by max_tokens; both must cut exactly there.
    stop_token = plain[0].token_ids[9]
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True,
                             stop_token_ids=[stop_token]),
              SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True)]
    for p in params:
        want, _ = run(model, prompts, p, block_size=4)
        got, engine = run(model, prompts, p, NGRAM, OracleProposer(refs), block_size=4)
        assert [(o.token_ids, o.finish_reason) for o in got] == [
            (o.token_ids, o.finish_reason) for o in want]
        assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    assert len(want[0].token_ids) == 7


def test_preemption_with_drafts_changes_nothing(tiny_model_dirs, prompts):
    model = tiny_model_dirs["llama"]
    plain, _ = run(model, prompts, GREEDY, block_size=4)
    refs = [list(p) + list(o.token_ids) for p, o in zip(prompts, plain)]
    got, engine = run(model, prompts, GREEDY, NGRAM, OracleProposer(refs), block_size=4,
                      num_kv_blocks=40)
    assert engine.scheduler.stats.preemptions > 0
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]


def test_batch_size_cutoff_and_ineligible_requests_do_not_speculate(tiny_model_dirs, prompts):
    model = tiny_model_dirs["llama"]
    cutoff = NGRAM[:-1] + ', "disable_by_batch_size": 4}'
    _, engine = run(model, prompts, GREEDY, cutoff, block_size=4)
    # Six requests run together to the end (all greedy, one length): no step has four or fewer.
    assert engine.speculator.stats.num_drafts == 0
    scored = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True,
                            prompt_logprobs=1)
    want, _ = run(model, prompts, scored, block_size=4)
    got, engine = run(model, prompts, scored, NGRAM, block_size=4)
    assert engine.speculator.stats.num_drafts == 0
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_sampled_requests_speculate_and_finish(tiny_model_dirs, prompts):
    model = tiny_model_dirs["llama"]
    plain, _ = run(model, prompts, GREEDY, block_size=4)
    refs = [list(p) + list(o.token_ids) for p, o in zip(prompts, plain)]
    # Near greedy, so that drafts of the greedy continuation are often right.
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.1, ignore_eos=True, logprobs=1)
    got, engine = run(model, prompts, params, NGRAM, OracleProposer(refs), block_size=4)
    assert all(len(o.token_ids) == MAX_TOKENS and len(o.logprobs) == MAX_TOKENS for o in got)
    assert all(lp.token_id == t for o in got for lp, t in zip(o.logprobs, o.token_ids))
    assert engine.speculator.stats.num_accepted_tokens > 0
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def test_metrics_have_vllm_meaning(tiny_model_dirs, prompts):
    model = tiny_model_dirs["llama"]
    plain, _ = run(model, prompts, GREEDY, block_size=4)
    refs = [list(p) + list(o.token_ids) for p, o in zip(prompts, plain)]
    _, engine = run(model, prompts, GREEDY, NGRAM, OracleProposer(refs), block_size=4)
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))
    text = generate_latest(registry).decode()
    stats = engine.speculator.stats
    for name, value in (("num_drafts", stats.num_drafts),
                        ("num_draft_tokens", stats.num_draft_tokens),
                        ("num_accepted_tokens", stats.num_accepted_tokens)):
        assert f'baton_spec_decode_{name}_total{{model_name="llama"}} {float(value)}' in text
    per_pos = [registry.get_sample_value("baton_spec_decode_num_accepted_tokens_per_pos_total",
                                         {"model_name": "llama", "position": str(j)})
               for j in range(4)]
    assert sum(per_pos) == stats.num_accepted_tokens > 0
    assert per_pos == sorted(per_pos, reverse=True)
