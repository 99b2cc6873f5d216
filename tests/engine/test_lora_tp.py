"""LoRA at tensor parallelism 2 on CPU (gloo): three PEFT adapters of different ranks and targets
and the base model, all in one engine at once, give at TP=2 the TP=1 engine's greedy tokens, and
transformers + peft's; with KV heads split over the ranks and replicated on both, with slots
taken in turn (an adapter evicted from host memory and read again by every rank) and with chunked
prefill mixing adapters within a chunk."""
from __future__ import annotations

import pytest

from baton.services.checkpoints.tiny_model import TinyModelSpec, make_tiny_model
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from tests.engine.engine_helpers import random_prompts
from tests.engine.lora_helpers import (assert_matches, greedy_reference, make_adapters,
                                       reference_model)

NEW_TOKENS = 10
PROMPTS_EACH = 2
ENGINE = dict(dtype="float32", device="cpu", num_kv_blocks=128, max_model_len=256, num_threads=1)
CASES = {
    # 2 KV heads: one per rank. Two slots and two host copies for three adapters.
    "kv-split": dict(max_loras=2, max_cpu_loras=2),
    # 1 KV head: both ranks hold it. Chunks of 16 tokens mix adapters.
    "kv-replicated": dict(max_loras=3, max_num_batched_tokens=16),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tiny_model_dirs, tmp_path_factory) -> dict:
    if request.param == "kv-split":
        model_dir = tiny_model_dirs["llama"]
    else:
        model_dir = make_tiny_model(tmp_path_factory.mktemp("llama-kv1"),
                                    TinyModelSpec.preset("llama", num_kv_heads=1))
    adapters = make_adapters(model_dir, tmp_path_factory.mktemp("tp-adapters"))
    prompts = random_prompts(PROMPTS_EACH, 200, seed=5, min_len=5, max_len=40)
    want = {name: [greedy_reference(reference_model(model_dir, adapters.get(name)), p,
                                    NEW_TOKENS) for p in prompts]
            for name in [None, *adapters]}
    return {"model": model_dir, "adapters": adapters, "prompts": prompts, "want": want,
            "engine": CASES[request.param]}


def _run_all(case: dict, tp: int) -> tuple[dict, int]:
    """Every adapter's and the base model's requests at once: their tokens, and slot loads."""
    modules = [f"{name}={path}" for name, path in case["adapters"].items()]
    engine = LLMEngine(EngineConfig(model=str(case["model"]), lora_modules=modules,
                                    tensor_parallel_size=tp, **ENGINE, **case["engine"]))
    try:
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        ids = {}
        for name in [None, *case["adapters"]]:
            for i, prompt in enumerate(case["prompts"]):
                engine.add_request(f"{name}-{i}", prompt, params, lora_name=name)
                ids[f"{name}-{i}"] = (name, i)
        done = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[ids[out.request_id]] = out.token_ids
        return done, engine.stats().lora.slot_loads
    finally:
        engine.close()


def test_tp2_matches_tp1_and_peft(case: dict) -> None:
    reference, _ = _run_all(case, 1)
    got, slot_loads = _run_all(case, 2)
    assert len(got) == (len(case["adapters"]) + 1) * PROMPTS_EACH
    assert got == reference
    for (name, i), tokens in got.items():
        want, gaps = case["want"][name][i]
        assert_matches(tokens, want, gaps, f"adapter {name} prompt {i} at TP=2")
    if case["engine"]["max_loras"] < len(case["adapters"]):
        assert slot_loads > len(case["adapters"]) - 1  # a slot was refilled on every rank
