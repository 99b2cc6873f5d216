"""Streamed outputs carry deltas; the histories they expose are exact snapshots as of their step."""
from baton.services.common.outputs import RequestOutput
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine


def every_output(model_dir, max_tokens: int, logprobs: int) -> list[RequestOutput]:
    """One greedy request's outputs, step by step."""
    engine = LLMEngine(EngineConfig(model=str(model_dir), num_kv_blocks=64))
    engine.add_request("r", list(range(20, 40)),
                       SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                                      logprobs=logprobs))
    outs: list[RequestOutput] = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    return outs


def test_deltas_add_up_and_histories_are_snapshots(tiny_model_dirs):
    outs = every_output(tiny_model_dirs["llama"], max_tokens=12, logprobs=2)
    tokens, text, logprobs = [], "", []
    for out in outs:  # read only after the request finished: each must still show its own step
        assert len(out.new_token_ids) == out.num_new_tokens == 1
        tokens += out.new_token_ids
        text += out.new_text
        logprobs += out.new_logprobs
        assert out.token_ids == tokens
        assert out.text == text
        assert out.logprobs == logprobs
        assert [lp.token_id for lp in out.new_logprobs] == out.new_token_ids
    assert outs[-1].finished and len(tokens) == 12


def test_constructed_outputs_derive_their_deltas():
    out = RequestOutput(request_id="x", prompt_token_ids=[1], token_ids=[5, 6, 7], text="abc",
                        num_new_tokens=2, new_text="bc")
    assert out.new_token_ids == [6, 7] and out.new_logprobs is None and out.text == "abc"


def test_outputs_merged_in_order_carry_both_deltas_and_the_later_state(tiny_model_dirs):
    outs = every_output(tiny_model_dirs["llama"], max_tokens=6, logprobs=1)
    merged = outs[1]
    for later in outs[2:]:
        merged = merged.then(later)
    assert merged.new_token_ids == [t for o in outs[1:] for t in o.new_token_ids]
    assert merged.num_new_tokens == 5 and merged.new_text == "".join(o.new_text for o in outs[1:])
    assert merged.new_logprobs == [lp for o in outs[1:] for lp in o.new_logprobs]
    assert merged.finished and merged.finish_reason == "length"
    assert merged.token_ids == outs[-1].token_ids and merged.text == outs[-1].text
    assert outs[0].then(outs[1]).token_ids == outs[1].token_ids  # the history as of the later one
