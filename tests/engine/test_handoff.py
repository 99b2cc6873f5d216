"""The engine's two ends of a KV hand-off, in one process: blocks copied between two engines' caches
give the same tokens as one engine alone, and every block comes back on both sides."""
from __future__ import annotations

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.requests import EngineRequest
from tests.engine.engine_helpers import greedy, random_prompts


def handoff(prefill: LLMEngine, decode: LLMEngine, rid: str, prompt: list[int],
            params: SamplingParams) -> list[int]:
    prefill.add_request(rid, prompt, SamplingParams(**{**vars(params), "max_tokens": 1}),
                        hold_kv=True)
    first = None
    while first is None:
        first = next((o for o in prefill.step() if o.request_id == rid and o.finished), None)
    src = prefill.held_kv(rid).block_ids
    dst, hits, _ = decode.reserve_prefilled(EngineRequest(rid, prompt, params))
    decode.kv_cache[:, dst[hits:]] = prefill.kv_cache[:, src[hits:]]
    assert prefill.release_kv(rid)
    out = decode.commit_prefilled(rid, first.token_ids[0])
    while not out.finished:
        out = next(o for o in decode.step() if o.request_id == rid)
    return out.token_ids


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_handoff_matches_one_engine(tiny_model_dirs, temperature):
    model = str(tiny_model_dirs["qwen3"])
    prompts = random_prompts(12, 500, seed=5, min_len=1, max_len=70)
    params = SamplingParams(max_tokens=12, temperature=temperature, seed=11, ignore_eos=True)
    colocated = LLMEngine(EngineConfig(model=model, num_kv_blocks=256)).generate(prompts, params)
    prefill, decode = LLMEngine(EngineConfig(model=model, num_kv_blocks=256)), LLMEngine(
        EngineConfig(model=model, num_kv_blocks=256))
    got = [handoff(prefill, decode, f"r{i}", p, params) for i, p in enumerate(prompts)]
    assert got == [o.token_ids for o in colocated]
    for engine in (prefill, decode):
        assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
        assert not engine.seqs and len(engine.handoffs) == 0


def test_receiver_skips_blocks_it_already_caches(tiny_model_dirs):
    model = str(tiny_model_dirs["llama"])
    prefill, decode = LLMEngine(EngineConfig(model=model, num_kv_blocks=256)), LLMEngine(
        EngineConfig(model=model, num_kv_blocks=256))
    shared = random_prompts(1, 500, seed=9, min_len=64, max_len=64)[0]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    handoff(prefill, decode, "a", shared + [1, 2, 3], params)
    _, hits, _ = decode.reserve_prefilled(EngineRequest("b", shared + [7, 8, 9, 10], params))
    assert hits == 64 // decode.blocks.block_size
    decode.abort_request("b")
    assert decode.blocks.num_free_blocks == decode.blocks.num_blocks


def test_continuing_after_generated_tokens_matches(tiny_model_dirs):
    """A request migrated with the tokens it already streamed continues exactly where it left
    off."""
    model = tiny_model_dirs["llama"]
    prompt = random_prompts(1, 500, seed=4, min_len=30, max_len=30)[0]
    full, _ = greedy(model, [prompt], max_tokens=20)
    engine = LLMEngine(EngineConfig(model=str(model), num_kv_blocks=256))
    engine.add_request("m", prompt, SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
                       output_token_ids=full[0][:7])
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert full[0][:7] + outs[-1].token_ids[7:] == full[0]
    assert outs[-1].token_ids == full[0]


def test_parked_reservation_keeps_its_blocks_until_released(tiny_model_dirs):
    """After a timed-out read, the reserved blocks stay taken (a late write may land) while the
    request itself is recomputed under its own id."""
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=64))
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    prompt = list(range(5, 45))
    blocks, _, _ = engine.reserve_prefilled(EngineRequest("r", prompt, params))
    ticket = engine.park_reserved("r")
    engine.add_request("r", prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks - len(blocks)
    assert engine.release_parked(ticket) and not engine.release_parked(ticket)
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def test_migration_keeps_held_back_text_and_stop_strings(tiny_model_dirs):
    """Cut anywhere, a request continued elsewhere releases exactly the text the first worker had
    not yet released, and a stop string straddling the cut still ends it."""
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=256))
    prompt = list(range(30, 60))
    free = engine.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0,
                                                    ignore_eos=True))[0]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=[free.text[6:10]])
    engine.add_request("whole", prompt, params)
    steps = []  # (tokens so far, text released so far)
    while engine.has_unfinished_requests():
        for out in engine.step():
            released = (steps[-1][1] if steps else "") + out.new_text
            steps.append((list(out.token_ids), released))
    assert out.finish_reason == "stop"
    for cut, (tokens, released) in enumerate(steps[:-1]):
        engine.add_request(f"cut{cut}", prompt, params, output_token_ids=tokens)
        text = released
        while engine.has_unfinished_requests():
            for out in engine.step():
                text += out.new_text
        assert (text, out.finish_reason) == (steps[-1][1], "stop"), cut
