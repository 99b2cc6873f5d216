"""Structured outputs in the engine: the grammar cache, the batch masks, and constrained generation
that stays valid across a prefill/decode hand-off and a migration."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from baton.services.common.sampling_params import SamplingParams, StructuredOutput
from baton.services.common.wire.worker import params_from_proto, params_to_proto
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.structured.compiler import GrammarCache, make_tokenizer
from baton.services.engine.structured.masks import MaskBuilder, unpack
from baton.services.engine.structured.matcher import GrammarState
from tests.engine.test_handoff import handoff

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "level": {"type": "integer", "minimum": 1, "maximum": 9},
        "colors": {
            "type": "array", "items": {"enum": ["red", "blue"]}, "minItems": 1, "maxItems": 3
        },
        "inner": {
            "type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"],
            "additionalProperties": False
        },
    },
    "required": ["name", "level", "colors", "inner"],
    "additionalProperties": False,
}
JSON_SPEC = StructuredOutput("json_schema", json.dumps(SCHEMA))
PROMPT = list(range(40, 60))


@pytest.fixture(scope="module")
def engine(tiny_model_dirs):
    return LLMEngine(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=256))


@pytest.fixture(scope="module")
def grammars(engine):
    return GrammarCache(
        make_tokenizer(engine.tokenizer, engine.model_config.vocab_size, engine.eos_ids),
        capacity=2)


@pytest.mark.parametrize("spec", [
    StructuredOutput("json_schema", "{not json"),
    StructuredOutput("json_schema", '{"type": "frobnicate"}'),
    StructuredOutput("json_schema", "[1, 2]"),
    StructuredOutput("regex", "a(b"),
    StructuredOutput("choice", "[]"),
    StructuredOutput("choice", '["a", 3]'),
    StructuredOutput("grammar", "start: nowhere"),
    StructuredOutput("yaml", "a: b"),
])
def test_bad_specs_are_value_errors(spec):
    with pytest.raises(ValueError, match="^structured_output"):
        SamplingParams(structured_output=spec).validate()


def test_cache_compiles_once_per_spec_and_stays_bounded(grammars):
    specs = [StructuredOutput("regex", f"x{i}[0-9]") for i in range(3)]
    grammars.matcher(specs[0])
    grammars.matcher(specs[0])
    assert (grammars.hits, grammars.misses) == (1, 1)
    grammars.matcher(specs[1])
    grammars.matcher(specs[2])  # evicts specs[0], the least recently used
    assert list(grammars.compiled) == specs[1:]
    # Copies are independent: advancing one leaves the cached grammar at its start.
    first = GrammarState(grammars.matcher(specs[1]))
    assert first.advance(grammars.tokenizer.tokenize_str("x1")[0])
    assert GrammarState(grammars.matcher(specs[1])).matcher.validate_tokens(
        grammars.tokenizer.tokenize_str("x15")) == len(grammars.tokenizer.tokenize_str("x15"))


def test_batch_masks_match_the_matchers_one_by_one(engine, grammars):
    """The packed masks, unpacked and applied to logits, allow exactly the tokens each matcher
    accepts."""
    vocab = engine.model_config.vocab_size

    class Row:  # what MaskBuilder and the sampler read of a sequence
        def __init__(self, rid: str, grammar: GrammarState | None) -> None:
            self.request_id, self.grammar = rid, grammar

    states = [
        GrammarState(grammars.matcher(JSON_SPEC)),
        GrammarState(grammars.matcher(StructuredOutput("choice", '["alpha", "beta"]')))
    ]
    states[0].replay(grammars.tokenizer.tokenize_str('{"name":"a'))
    rows = [Row("free", None), Row("json", states[0]), Row("choice", states[1])]
    pending = MaskBuilder(vocab).fill(rows)
    logits = torch.zeros(3, vocab)
    # the logits' row order need not be the order the masks were filled in
    pending.apply(logits, rows[::-1])
    assert bool(torch.isfinite(logits[2]).all())  # the unconstrained row is untouched
    for row, state in ((1, states[0]), (0, states[1])):
        allowed = torch.isfinite(logits[row]).nonzero().flatten().tolist()
        expected = [t for t in range(vocab) if state.matcher.validate_tokens([t]) == 1]
        assert allowed == expected and 0 < len(allowed) < vocab


def test_unpack_bit_order():
    bitmask = torch.tensor([[0b101, -2 ** 31]], dtype=torch.int32)
    allowed = unpack(bitmask, 64)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2, 63]
    assert unpack(bitmask, 40).shape == (1, 40)


def test_generation_follows_each_kind(engine):
    cases = [
        (JSON_SPEC, lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None),
        (StructuredOutput("regex", r"[a-f]{2,4}@[0-9]{2}"),
         lambda text: re.fullmatch(r"[a-f]{2,4}@[0-9]{2}", text)),
        (StructuredOutput("choice", '["one", "two words", "three"]'), lambda text: text in
         ("one", "two words", "three")),
        (StructuredOutput("grammar", 'start: "<" WORD ">"\nWORD: /[a-z]{1,5}/'),
         lambda text: re.fullmatch(r"<[a-z]{1,5}>", text)),
        # What tool calling builds: Lark around an embedded JSON schema (compact through
        # x-guidance).
        (StructuredOutput(
            "grammar", 'start: "<call>" args "</call>"\nargs: %json' +
            json.dumps({**SCHEMA, "x-guidance": {"whitespace_flexible": False}})), lambda text:
         jsonschema.validate(json.loads(text.removeprefix("<call>").removesuffix("</call>")), SCHEMA
                             ) is None and text.startswith("<call>{")),
    ]
    for spec, ok in cases:
        params = [
            SamplingParams(max_tokens=120, temperature=1.0, seed=s, structured_output=spec)
            for s in range(4)
        ]
        for out in engine.generate([PROMPT] * 4, params):
            assert out.finish_reason == "stop" and ok(out.text), (spec.kind, out.text)


def test_mixed_batch_leaves_free_rows_alone(engine):
    free = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    alone = engine.generate([PROMPT], free)[0]
    outs = engine.generate([PROMPT, PROMPT], [free, SamplingParams(max_tokens=120, temperature=0.0,
                                                                   structured_output=JSON_SPEC)])
    assert outs[0].token_ids == alone.token_ids
    jsonschema.validate(json.loads(outs[1].text), SCHEMA)


def test_grammar_continues_across_a_handoff(tiny_model_dirs):
    """The prefill engine draws the first token under the grammar; the decode engine carries the
    grammar on from it, giving the tokens one engine alone gives."""
    model = str(tiny_model_dirs["llama"])
    params = SamplingParams(max_tokens=120, temperature=0.8, seed=3, structured_output=JSON_SPEC)
    alone = LLMEngine(EngineConfig(model=model, num_kv_blocks=256)).generate([PROMPT], params)[0]
    prefill, decode = (LLMEngine(EngineConfig(model=model, num_kv_blocks=256)) for _ in range(2))
    tokens = handoff(prefill, decode, "h", PROMPT, params)
    assert tokens == alone.token_ids
    jsonschema.validate(json.loads(decode.tokenizer.decode(tokens)), SCHEMA)


def test_grammar_survives_migration(engine):
    """Continued from any cut with the tokens already streamed, the request ends as the uncut one
    did."""
    params = SamplingParams(max_tokens=120, temperature=0.0, structured_output=JSON_SPEC)
    whole = engine.generate([PROMPT], params)[0]
    assert whole.finish_reason == "stop"
    for cut in (1, len(whole.token_ids) // 2, len(whole.token_ids) - 1):
        engine.add_request(f"cut{cut}", PROMPT, params, output_token_ids=whole.token_ids[:cut])
        while engine.has_unfinished_requests():
            for out in engine.step():
                last = out
        assert (last.token_ids, last.finish_reason) == (whole.token_ids, "stop"), cut


def test_replayed_tokens_that_break_the_grammar_are_refused(engine):
    params = SamplingParams(max_tokens=50, structured_output=StructuredOutput("regex", "[0-9]+"))
    letters = engine.tokenizer.encode("abc")
    with pytest.raises(ValueError, match="does not follow"):
        engine.add_request("bad", PROMPT, params, output_token_ids=letters)
    assert "bad" not in engine.seqs


def test_proto_round_trip():
    params = SamplingParams(max_tokens=5, structured_output=JSON_SPEC)
    assert params_from_proto(params_to_proto(params)) == params
    assert params_from_proto(params_to_proto(SamplingParams())).structured_output is None
