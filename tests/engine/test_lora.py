"""LoRA adapters in mixed batches: the engine's greedy outputs for three PEFT adapters of
different ranks and targets (rsLoRA among them) and the base model, all in one engine at
once, against transformers + peft; slots under pressure (no thrashing); KV never shared across
adapters."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from tests.engine.eagle_helpers import make_head
from tests.engine.engine_helpers import random_prompts
from tests.engine.lora_helpers import (assert_matches, greedy_reference, make_adapters,
                                       reference_model)

NEW_TOKENS = 12
PROMPTS_EACH = 2


@pytest.fixture(scope="module")
def case(tiny_model_dirs, tmp_path_factory) -> dict:
    model_dir = tiny_model_dirs["llama"]
    adapters = make_adapters(model_dir, tmp_path_factory.mktemp("adapters"))
    prompts = random_prompts(PROMPTS_EACH, 200, seed=7, min_len=5, max_len=40)
    # The same prompts under every adapter and the base: a shared prefix cache would show.
    want = {}
    for name in [None, *adapters]:
        model = reference_model(model_dir, adapters.get(name))
        want[name] = [greedy_reference(model, p, NEW_TOKENS) for p in prompts]
        assert name is None or [w[0] for w in want[name]] != [w[0] for w in want[None]], \
            f"adapter {name} must change the outputs, or the test proves nothing"
    return {"model": model_dir, "adapters": adapters, "prompts": prompts, "want": want}


def _engine(case: dict, **kwargs) -> LLMEngine:
    modules = [f"{name}={path}" for name, path in case["adapters"].items()]
    return LLMEngine(EngineConfig(model=str(case["model"]), dtype="float32", lora_modules=modules,
                                  num_kv_blocks=256,
                                  **kwargs))


def _run_all(engine: LLMEngine, case: dict) -> dict:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    ids = {}
    for name in [None, *case["adapters"]]:
        for i, prompt in enumerate(case["prompts"]):
            rid = f"{name}-{i}"
            engine.add_request(rid, prompt, params, lora_name=name)
            ids[rid] = (name, i)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    return {ids[rid]: out.token_ids for rid, out in done.items()}


@pytest.mark.parametrize("kwargs", [
    dict(max_loras=3),
    dict(max_loras=3, max_num_batched_tokens=16),  # chunked prefill, chunks of mixed adapters
    dict(max_loras=1, max_cpu_loras=1),  # one slot: adapters take turns, reloaded from disk
], ids=["resident", "chunked", "one-slot"])
def test_mixed_batch_matches_peft(case: dict, kwargs: dict) -> None:
    engine = _engine(case, **kwargs)
    got = _run_all(engine, case)
    assert len(got) == (len(case["adapters"]) + 1) * PROMPTS_EACH
    for (name, i), tokens in got.items():
        want, gaps = case["want"][name][i]
        assert_matches(tokens, want, gaps, f"adapter {name} prompt {i}")
    stats = engine.stats().lora
    assert stats.registered == sorted(case["adapters"])
    # Every request of an adapter after the first found it resident or waited for its turn:
    # each adapter was copied into a slot once, however the requests interleaved.
    assert stats.slot_loads == len(case["adapters"])
    assert stats.generation_tokens == {n: PROMPTS_EACH * NEW_TOKENS for n in case["adapters"]}


@pytest.mark.parametrize("method", ["draft_model", "ngram", "eagle"])
def test_speculation_keeps_each_adapters_outputs(case: dict, method: str, tmp_path: Path) -> None:
    """Drafts come from the base (the base model as its own draft, n-grams of the text, an EAGLE
    head over the adapted target's hidden states) and the target verifies them under each
    request's adapter: outputs are still transformers + peft's. With the base as draft, a verify
    pass that read the base at the draft positions would accept the base's tokens and fail."""
    spec: dict = {"method": method, "num_speculative_tokens": 3}
    if method == "ngram":
        spec |= {"prompt_lookup_min": 1, "prompt_lookup_max": 3}
    elif method == "draft_model":
        spec["model"] = str(case["model"])
    else:  # a random head: drafts mostly rejected, the verify pass still under each adapter
        spec["model"] = str(make_head(case["model"], tmp_path / "head", False))
    engine = _engine(case, max_loras=3, speculative_config=json.dumps(spec))
    got = _run_all(engine, case)
    for (name, i), tokens in got.items():
        want, gaps = case["want"][name][i]
        assert_matches(tokens, want, gaps, f"{method}: adapter {name} prompt {i}")
    assert engine.speculator.stats.num_drafts > 0
    if method == "draft_model":
        assert engine.speculator.stats.num_accepted_tokens > 0
        assert engine.speculator.proposer.runner.lora is None, "the draft carries no adapters"


def test_no_thrashing_when_adapters_outnumber_slots(case: dict) -> None:
    """Requests of four adapters, interleaved, over two slots: each adapter enters a slot once
    (waiting ones are passed over, never evicting an adapter its sequences still use)."""
    engine = _engine(case, max_loras=2)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    names = [*case["adapters"], None]
    for i in range(24):
        engine.add_request(f"r{i}", case["prompts"][i % PROMPTS_EACH], params,
                           lora_name=names[i % len(names)])
    waiting_seen = set()
    while engine.has_unfinished_requests():
        engine.step()
        stats = engine.stats()
        assert len(stats.lora.resident) <= 2
        waiting_seen |= set(stats.lora_waiting)
    assert engine.stats().lora.slot_loads == len(case["adapters"])
    assert waiting_seen, "with 3 adapters over 2 slots one must have waited"


def test_prefix_cache_keeps_adapters_apart(case: dict) -> None:
    engine = _engine(case, max_loras=3)
    prompt = case["prompts"][0] * 3  # several full blocks
    hashes = {}
    for name in [None, *case["adapters"]]:
        engine.add_request(f"h-{name}", prompt, SamplingParams(max_tokens=1), lora_name=name)
        hashes[name] = engine.seqs[f"h-{name}"].full_block_hashes(engine.block_size,
                                                                  engine.model_id)
    assert len({h[0] for h in hashes.values()}) == len(hashes)


def test_unknown_adapter_is_refused(case: dict) -> None:
    engine = _engine(case)
    with pytest.raises(ValueError, match="not served here"):
        engine.add_request("x", [1, 2, 3], SamplingParams(max_tokens=2), lora_name="nope")
    assert not engine.has_unfinished_requests()


def test_lora_off_refuses_adapters(case: dict) -> None:
    engine = LLMEngine(EngineConfig(model=str(case["model"]), dtype="float32", num_kv_blocks=64))
    with pytest.raises(ValueError, match="LoRA is off"):
        engine.add_request("x", [1, 2, 3], SamplingParams(max_tokens=2), lora_name="qv8")
    assert Path(case["model"]).exists()


def test_metrics_name_the_adapters(case: dict) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from baton.services.engine.metrics import EngineCollector
    # Every adapter in host memory: the first request's adapter takes the one slot at once.
    engine = _engine(case, max_loras=1, max_cpu_loras=3)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.add_request("a", case["prompts"][0], params, lora_name="qv8")
    engine.add_request("b", case["prompts"][0], params, lora_name="all16")
    engine.step()
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))
    text = generate_latest(registry).decode()
    assert ('baton_lora_requests_info{max_lora="1",running_lora_adapters="qv8",'
            'waiting_lora_adapters="all16"}') in text
    while engine.has_unfinished_requests():
        engine.step()
    text = generate_latest(registry).decode()
    for name in ("qv8", "all16"):
        assert (f'baton_lora_generation_tokens_total{{lora_name="{name}",model_name='
                f'"{engine.model_id}"}} 3.0') in text, text
    assert "baton_lora_slot_loads_total 2.0" in text
