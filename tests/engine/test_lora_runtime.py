"""LoRA adapters loaded and unloaded while the engine serves (services/engine/lora/runtime.py): an
adapter loaded at runtime answers what the same adapter given at start answers; an unload refuses
new requests at once while the running ones finish under it, and requests admitted elsewhere before
it (a hand-off's decode side, a migrated stream) still run under it when they arrive after it;
every bad adapter is refused by name and the engine goes on serving."""
from __future__ import annotations

from pathlib import Path

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.lora import runtime
from baton.services.engine.lora.modules import (LoRAError, LoRAExists, LoRAModule,
                                                LoRANotFound)
from baton.services.engine.requests import EngineRequest
from baton.services.checkpoints.tiny_lora import make_tiny_lora
from tests.engine.engine_helpers import random_prompts
from tests.engine.lora_helpers import make_bad_adapters

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def adapter(tiny_model_dirs, tmp_path_factory) -> Path:
    return make_tiny_lora(tiny_model_dirs["llama"], tmp_path_factory.mktemp("rt") / "qv8", 8,
                          ("q_proj", "v_proj"), seed=1)


@pytest.fixture
def engine(tiny_model_dirs, adapter) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(tiny_model_dirs["llama"]), dtype="float32",
                                  lora_modules=[f"qv8={adapter}"], max_loras=2,
                                  num_kv_blocks=128))


def _params(tokens: int = NEW_TOKENS) -> SamplingParams:
    return SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)


def _load(engine: LLMEngine, name: str, path: Path) -> None:
    module = LoRAModule(name, str(path))
    runtime.load(engine, module, runtime.read(engine, module))


def _run(engine: LLMEngine) -> dict[str, list[int]]:
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.token_ids
        runtime.drop_retired(engine)  # as the worker's engine loop does after each step
    return done


def test_loaded_at_runtime_answers_as_given_at_start(engine, adapter) -> None:
    _load(engine, "qv8-rt", adapter)
    assert engine.stats().lora.registered == ["qv8", "qv8-rt"]
    prompts = random_prompts(3, 200, seed=5, min_len=5, max_len=30)
    for i, prompt in enumerate(prompts):
        for name in (None, "qv8", "qv8-rt"):
            engine.add_request(f"{name}-{i}", prompt, _params(), lora_name=name)
    got = _run(engine)
    for i in range(len(prompts)):
        assert got[f"qv8-rt-{i}"] == got[f"qv8-{i}"]
    assert any(got[f"None-{i}"] != got[f"qv8-{i}"] for i in range(len(prompts))), \
        "the adapter must change the outputs, or the test proves nothing"


def test_unload_in_use_finishes_its_requests_first(engine, adapter) -> None:
    engine.add_request("running", [5, 6, 7, 8], _params(16), lora_name="qv8")
    engine.step()
    assert runtime.unload(engine, "qv8") == 1
    with pytest.raises(LoRANotFound, match="'qv8' is not served here"):
        engine.add_request("late", [5, 6, 7], _params(), lora_name="qv8")
    with pytest.raises(LoRANotFound):
        runtime.unload(engine, "qv8")
    with pytest.raises(LoRAExists, match="being unloaded"):
        runtime.read(engine, LoRAModule("qv8", str(adapter)))
    assert engine.stats().lora.registered == []  # the router and gateway stop offering it
    assert len(_run(engine)["running"]) == 16
    assert "qv8" not in engine.lora.modules and not engine.lora.retiring
    _load(engine, "qv8", adapter)  # the name is free again
    engine.add_request("again", [5, 6, 7], _params(), lora_name="qv8")
    assert len(_run(engine)["again"]) == NEW_TOKENS


def test_unload_idle_adapter_goes_at_once(engine) -> None:
    assert runtime.unload(engine, "qv8") == 0
    assert "qv8" not in engine.lora.modules
    with pytest.raises(LoRANotFound, match="'nope' is not served here"):
        runtime.unload(engine, "nope")


def _prefill(engine: LLMEngine, rid: str, prompt: list[int], lora_name: str) -> int:
    """The prefill side of a hand-off: the first token, the prompt's KV held for the decode side."""
    engine.add_request(rid, prompt, _params(1), hold_kv=True, lora_name=lora_name)
    while True:
        for out in engine.step():
            if out.request_id == rid and out.finished:
                return out.token_ids[0]


def test_a_handoff_admitted_before_the_unload_runs_under_it(engine, tiny_model_dirs,
                                                            adapter) -> None:
    """The P/D race: the unload lands on both workers while the request is between its prefill
    and its decode; the decode worker, which had no request under the adapter and dropped it at
    once, still runs the hand-off under it, as a colocated worker runs its admitted requests."""
    config = EngineConfig(model=str(tiny_model_dirs["llama"]), dtype="float32", enable_lora=True,
                          max_loras=2, num_kv_blocks=128)
    prefill, decode = LLMEngine(config), LLMEngine(config)
    for side in (prefill, decode):
        _load(side, "rt", adapter)
    prompts = random_prompts(2, 200, seed=7, min_len=5, max_len=30)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"want-{i}", prompt, _params(), lora_name="qv8")
    want = _run(engine)
    first = _prefill(prefill, "handed", prompts[0], "rt")
    assert runtime.unload(prefill, "rt") == 0 and runtime.unload(decode, "rt") == 0
    assert "rt" not in decode.lora.modules
    with pytest.raises(LoRANotFound):  # new requests are refused at once
        decode.add_request("new", prompts[0], _params(), lora_name="rt")
    request = EngineRequest("handed", prompts[0], _params(), lora_name="rt")
    dst, hits, _ = decode.reserve_prefilled(request)
    decode.kv_cache[:, dst[hits:]] = prefill.kv_cache[:, prefill.held_kv("handed").block_ids[hits:]]
    assert prefill.release_kv("handed")
    decode.commit_prefilled("handed", first)
    # and a stream migrated here from a worker that had admitted it
    decode.add_request("moved", prompts[1], _params(), lora_name="rt",
                       output_token_ids=want["want-1"][:3])
    got = _run(decode)
    assert got["handed"] == want["want-0"]
    assert got["moved"] == want["want-1"]
    assert "rt" not in decode.lora.modules and not decode.lora.retiring, "dropped again after"
    with pytest.raises(LoRANotFound):  # an adapter this worker never served is still unknown
        decode.reserve_prefilled(EngineRequest("other", prompts[0], _params(), lora_name="x"))


def test_bad_adapters_are_refused_and_serving_goes_on(engine, adapter, tiny_model_dirs,
                                                      tmp_path) -> None:
    cases = make_bad_adapters(tiny_model_dirs, tmp_path, max_rank=16)
    for what, (path, message) in cases.items():
        with pytest.raises(LoRAError, match=message):
            _load(engine, f"bad-{what}", path)
    for name, why in (("qv8", "already been loaded"), ("llama", "base model")):
        with pytest.raises(LoRAExists, match=why):
            _load(engine, name, adapter)
    assert engine.stats().lora.registered == ["qv8"]
    engine.add_request("after", [5, 6, 7], _params(), lora_name="qv8")
    assert len(_run(engine)["after"]) == NEW_TOKENS


def test_lora_off(tiny_model_dirs, adapter) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=64))
    with pytest.raises(runtime.LoRAOff, match="--enable-lora"):
        runtime.read(engine, LoRAModule("a", str(adapter)))
    with pytest.raises(runtime.LoRAOff):
        runtime.unload(engine, "a")
