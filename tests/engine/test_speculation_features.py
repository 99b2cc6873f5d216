"""Speculation with everything else that shapes decoding: penalties and logit bias score every
verified position as plain decoding would, stop strings cut inside a draft, `n` copies of a prompt
share its blocks, and a structured output's drafts are checked against the grammar, whose matcher
verification rolls back. Greedy outputs equal those without speculation, token for token."""
from __future__ import annotations

import json

import jsonschema
import pytest

from baton.services.common.sampling_params import SamplingParams, StructuredOutput
from tests.engine.engine_helpers import random_prompts
from tests.engine.test_speculation import NGRAM, OracleProposer, run

MAX_TOKENS = 32
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "tags": {"type": "array", "items": {"enum": ["red", "blue", "green"]}, "maxItems": 4}},
    "required": ["name", "tags"], "additionalProperties": False}


@pytest.fixture(scope="module")
def prompts():
    base = random_prompts(4, vocab_size=500, seed=7, min_len=8, max_len=40)
    return base + [p + p[:len(p) // 2] for p in base[:2]]


def greedy(**kwargs) -> SamplingParams:
    return SamplingParams(**{"max_tokens": MAX_TOKENS, "temperature": 0.0, "ignore_eos": True,
                             "logprobs": 2, **kwargs})


def with_and_without(model, prompts, params):
    """Outputs without speculation, then with drafts of that very output (every third corrupted,
    see OracleProposer), and the speculating engine."""
    want, _ = run(model, prompts, params, block_size=4)
    refs = [list(p) + list(o.token_ids) for p, o in zip(prompts, want)]
    got, engine = run(model, prompts, params, NGRAM, OracleProposer(refs), block_size=4)
    return want, got, engine


def assert_same(want, got) -> None:
    assert [(o.token_ids, o.finish_reason) for o in got] == [
        (o.token_ids, o.finish_reason) for o in want]
    for a, b in zip(got, want):
        if b.logprobs is not None:
            assert [lp.logprob for lp in a.logprobs] == pytest.approx(
                [lp.logprob for lp in b.logprobs], abs=1e-4)


def test_penalties_and_logit_bias_score_every_verified_position(tiny_model_dirs, prompts):
    params = [greedy(repetition_penalty=1.4), greedy(frequency_penalty=0.7, presence_penalty=0.4),
              greedy(logit_bias={7: 2.5, 300: 1.5, 301: -3.0}),
              greedy(repetition_penalty=0.8, frequency_penalty=-0.3, logit_bias={42: 2.0})]
    want, got, engine = with_and_without(tiny_model_dirs["llama"], prompts,
                                         [params[i % len(params)] for i in range(len(prompts))])
    assert_same(want, got)
    stats = engine.speculator.stats
    assert stats.num_accepted_tokens > 0 and stats.accepted_per_pos[-1] > 0
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def test_stop_strings_cut_inside_a_draft(tiny_model_dirs, prompts):
    model = tiny_model_dirs["llama"]
    plain, engine = run(model, prompts, greedy(logprobs=None), block_size=4)
    # A stop string made of output tokens 9-10 of each of the first two requests.
    stops = [engine.tokenizer.decode(o.token_ids[9:11]) for o in plain[:2]]
    params = greedy(logprobs=None, stop=[s for s in stops if s.strip()])
    want, got, _ = with_and_without(model, prompts, params)
    assert_same(want, got)
    assert [o.text for o in got] == [o.text for o in want]
    assert want[0].finish_reason == "stop" and len(want[0].token_ids) <= 11


def test_copies_of_one_prompt_as_for_n(tiny_model_dirs, prompts):
    """`n` > 1 reaches the engine as n requests with one prompt: they share its cached blocks
    while each drafts and rolls back its own tail."""
    copies = [prompts[4]] * 3 + [prompts[0]] * 2
    params = greedy(max_tokens=24)
    want, got, engine = with_and_without(tiny_model_dirs["qwen2"], copies, params)
    assert_same(want, got)
    assert len({tuple(o.token_ids) for o in got[:3]}) == 1
    sampled = SamplingParams(max_tokens=24, temperature=0.7, ignore_eos=True)
    outs, engine = run(tiny_model_dirs["qwen2"], copies, sampled, NGRAM, block_size=4)
    assert all(len(o.token_ids) == 24 for o in outs)
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


class GrammarBreakingOracle(OracleProposer):
    """Also drafts, every fourth call, a token no JSON output may contain next (a NUL byte's
    token): the grammar must cut the draft there."""

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        draft = super().propose(token_ids, k)
        if self.calls % 4 == 2 and len(draft) > 2:
            draft[2] = 3  # the first byte token: "\x00" cannot appear in JSON text
        return draft


def test_structured_output_drafts_follow_the_grammar(tiny_model_dirs, prompts):
    model = tiny_model_dirs["llama"]
    params = SamplingParams(max_tokens=80, temperature=0.0, logprobs=1,
                            structured_output=StructuredOutput("json_schema", json.dumps(SCHEMA)))
    want, engine = run(model, prompts, params, block_size=4)
    refs = [list(p) + list(o.token_ids) for p, o in zip(prompts, want)]
    got, spec = run(model, prompts, params, NGRAM, GrammarBreakingOracle(refs), block_size=4)
    assert_same(want, got)
    for out in got:
        assert out.finish_reason == "stop"
        jsonschema.validate(json.loads(engine.tokenizer.decode(out.token_ids)), SCHEMA)
    assert spec.speculator.stats.accepted_per_pos[-1] > 0
    sampled = SamplingParams(max_tokens=80, temperature=0.8,
                             structured_output=params.structured_output)
    outs, spec = run(model, prompts, sampled, NGRAM, GrammarBreakingOracle(refs), block_size=4)
    for out in outs:
        if out.finish_reason == "stop":
            jsonschema.validate(json.loads(engine.tokenizer.decode(out.token_ids)), SCHEMA)
    assert spec.speculator.stats.num_drafts > 0
