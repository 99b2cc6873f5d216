"""The output processor takes a list of accepted tokens per sequence: several tokens in one list
end the request exactly where the same tokens one per step would, and whatever follows a stop is
dropped."""
from __future__ import annotations

import pytest

from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine

PROMPT = list(range(20, 40))
TEXT = "the cat sat on the mat, then the dog ran far away from the house"
STOP_AT = 10  # index of the token each case makes the last one (a comma, its first)


def _engine(model_dir) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model_dir), num_kv_blocks=64))


def _feed(engine: LLMEngine, params: SamplingParams,
          chunks: list[list[int]]) -> list[RequestOutput]:
    """Appends each chunk as one step's accepted tokens, until the request finishes."""
    engine.add_request("r", PROMPT, params)
    seq = engine.seqs["r"]
    outs = []
    for chunk in chunks:
        lps = [TokenLogprobs(token_id=t, logprob=-0.5, rank=1) for t in chunk]
        outs.append(engine.outputs.append(seq, chunk, lps))
        if outs[-1].finished:
            break
    return outs


def _params(case: str, tokens: list[int]) -> SamplingParams:
    common = dict(temperature=0.0, logprobs=0, max_tokens=len(tokens))
    if case == "stop string":
        return SamplingParams(stop=["the dog"], **common)
    if case == "stop token":
        return SamplingParams(stop_token_ids=[tokens[STOP_AT]], **common)
    if case == "eos":
        return SamplingParams(**common)
    return SamplingParams(**common | {"max_tokens": STOP_AT + 1})


@pytest.mark.parametrize("case", ["stop string", "stop token", "eos", "length"])
def test_a_list_ends_where_one_token_per_step_ends_and_drops_the_rest(tiny_model_dirs, case):
    engine = _engine(tiny_model_dirs["llama"])
    tokens = engine.tokenizer.encode(TEXT, add_special_tokens=False)
    assert len(tokens) > STOP_AT + 3 and tokens.index(tokens[STOP_AT]) == STOP_AT
    if case == "eos":
        tokens[STOP_AT] = min(engine.eos_ids)
    params = _params(case, tokens)

    one_by_one = _feed(engine, params, [[t] for t in tokens])
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks and not engine.seqs
    [together] = _feed(engine, params, [tokens])
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks and not engine.seqs

    final = one_by_one[-1]
    assert final.finished and together.finished
    assert (together.finish_reason, together.stop_reason) == (final.finish_reason,
                                                              final.stop_reason)
    assert together.token_ids == final.token_ids and together.text == final.text
    assert together.new_token_ids == final.token_ids  # every kept token is new in the one output
    assert together.num_new_tokens == len(one_by_one) < len(tokens)
    assert together.new_text == "".join(o.new_text for o in one_by_one)
    assert [lp.token_id for lp in together.new_logprobs] == final.token_ids
    if case == "stop string":
        assert final.stop_reason == "the dog" and final.text == TEXT[:TEXT.index("the dog")]
    else:
        assert final.token_ids == tokens[:STOP_AT + 1]


def test_lists_of_several_tokens_stream_the_same_text_as_single_tokens(tiny_model_dirs):
    engine = _engine(tiny_model_dirs["llama"])
    tokens = engine.tokenizer.encode(TEXT, add_special_tokens=False)
    params = SamplingParams(temperature=0.0, max_tokens=len(tokens), ignore_eos=True)
    one_by_one = _feed(engine, params, [[t] for t in tokens])
    in_threes = _feed(engine, params, [tokens[i:i + 3] for i in range(0, len(tokens), 3)])

    assert [o.num_new_tokens for o in in_threes][:-1] == [3] * (len(in_threes) - 1)
    assert in_threes[-1].token_ids == one_by_one[-1].token_ids == tokens
    assert "".join(o.new_text for o in in_threes) == "".join(o.new_text for o in one_by_one)
    assert in_threes[-1].finish_reason == one_by_one[-1].finish_reason == "length"
