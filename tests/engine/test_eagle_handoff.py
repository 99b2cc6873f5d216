"""An EAGLE head's KV across a KV hand-off: the prefill engine runs the head over the prompt and the
hand-off moves the head's blocks and the prompt's last target row with the target's, so the decode
engine's drafts are the colocated engine's, step for step, for a random head (whose drafts depend
on its attention over the whole prompt)."""
from __future__ import annotations

import json

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.requests import EngineRequest
from tests.engine.eagle_helpers import make_head
from tests.engine.engine_helpers import random_prompts
from tests.engine.test_speculation_draft import DraftRecorder, assert_all_blocks_free

K = 3
RANDOM = (("eagle", "llama"), ("eagle3", "qwen2"))
PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def heads(tiny_model_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle-handoff-heads")
    return {m: make_head(tiny_model_dirs[arch], root / m, m == "eagle3") for m, arch in RANDOM}


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(3, vocab_size=500, seed=7, min_len=6, max_len=30)


def engine(model, head=None, method="eagle") -> LLMEngine:
    spec = head and json.dumps({"method": method, "model": str(head),
                                "num_speculative_tokens": K})
    made = LLMEngine(EngineConfig(model=str(model), num_kv_blocks=128, block_size=4,
                                  speculative_config=spec))
    if made.speculator is not None:
        made.speculator.proposer = DraftRecorder(made.speculator.proposer)
    return made


def handoff(prefill: LLMEngine, decode: LLMEngine, rid: str, prompt: list[int],
            with_head: bool = True) -> list[int]:
    """test_handoff.py's hand-off, moving the head's blocks and last row too when both ends have
    a head (as the transports do) and with_head."""
    prefill.add_request(rid, prompt, SamplingParams(**{**vars(PARAMS), "max_tokens": 1}),
                        hold_kv=True)
    first = None
    while first is None:
        first = next((o for o in prefill.step() if o.request_id == rid and o.finished), None)
    held = prefill.held_kv(rid)
    dst, hits, _ = decode.reserve_prefilled(EngineRequest(rid, prompt, PARAMS))
    decode.kv_cache[:, dst[hits:]] = prefill.kv_cache[:, held.block_ids[hits:]]
    both = with_head and None not in (prefill.head_kv_cache, decode.head_kv_cache)
    if both:
        decode.head_kv_cache[:, dst] = prefill.head_kv_cache[:, held.block_ids]
    assert prefill.release_kv(rid)
    out = decode.commit_prefilled(rid, first.token_ids[0], None,
                                  held.head_row if both else None)
    while not out.finished:
        out = next(o for o in decode.step() if o.request_id == rid)
    return out.token_ids


def one_by_one(colocated: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    return [colocated.generate([p], PARAMS)[0].token_ids for p in prompts]


@pytest.mark.parametrize("method, arch", RANDOM)
def test_decode_drafts_equal_colocated(tiny_model_dirs, heads, prompts, method, arch):
    model, head = tiny_model_dirs[arch], heads[method]
    colocated = engine(model, head, method)
    want = one_by_one(colocated, prompts)
    prefill, decode = engine(model, head, method), engine(model, head, method)
    got = [handoff(prefill, decode, f"r{i}", p) for i, p in enumerate(prompts)]
    assert got == want
    expected = colocated.speculator.proposer.drafts
    assert len(expected) >= 2 * len(prompts)
    assert decode.speculator.proposer.drafts == expected
    a, b = decode.speculator.stats, colocated.speculator.stats
    assert (a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens) == (
        b.num_drafts, b.num_draft_tokens, b.num_accepted_tokens)
    # Without the head's KV the decode side drafts from its own first step on, and differently.
    blind = engine(model, head, method)
    assert [handoff(prefill, blind, f"b{i}", p, with_head=False)
            for i, p in enumerate(prompts)] == want
    assert blind.speculator.proposer.drafts != expected
    for each in (prefill, decode, blind):
        assert_all_blocks_free(each)
        assert len(each.handoffs) == 0


def test_either_end_without_a_head_hands_off_the_target_alone(tiny_model_dirs, heads, prompts):
    model, head = tiny_model_dirs["llama"], heads["eagle"]
    want = one_by_one(engine(model), prompts)
    for prefill, decode in ((engine(model, head), engine(model)),
                            (engine(model), engine(model, head))):
        assert [handoff(prefill, decode, f"r{i}", p) for i, p in enumerate(prompts)] == want
        assert_all_blocks_free(prefill)
        assert_all_blocks_free(decode)
