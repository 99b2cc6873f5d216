"""`baton serve` with --speculative-config, colocated and disaggregated (speculation on the decode
worker after a KV hand-off), n-gram and an EAGLE-3 head: greedy completions through the official
openai client are those of the engine without speculation, token for token, and the decode worker
did verify drafts."""
from __future__ import annotations

import json

import openai
import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from tests.engine.eagle_helpers import make_head
from tests.engine.engine_helpers import random_prompts
from tests.launcher import Stack, metric, start_stack

SPEC = ('--speculative-config={"method": "ngram", "num_speculative_tokens": 3, '
        '"prompt_lookup_min": 1, "prompt_lookup_max": 2}')
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def model(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="module")
def specs(model, tmp_path_factory):
    head = make_head(model, tmp_path_factory.mktemp("serve-eagle") / "head", True)
    return {"ngram": SPEC, "eagle3": "--speculative-config=" + json.dumps(
        {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3})}


@pytest.fixture(scope="module")
def prompts():
    base = random_prompts(3, vocab_size=500, seed=5, min_len=10, max_len=30)
    return base + [p + p for p in base]


@pytest.fixture(scope="module")
def expected(model, prompts):
    engine = LLMEngine(EngineConfig(model=str(model), num_kv_blocks=256))
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [list(o.token_ids) for o in engine.generate(prompts, params)]


def answers(stack: Stack, model, prompts) -> list[list[int]]:
    client = openai.OpenAI(base_url=stack.url, api_key="unused", max_retries=0, timeout=120)
    got = []
    for prompt in prompts:
        done = client.completions.create(
            model=model.name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True})
        got.append(done.choices[0].model_extra["token_ids"])
    return got


@pytest.mark.parametrize("mode, router_args, method", [
    ("colocated", [], "ngram"),
    # Every prompt prefilled on the prefill worker and handed off: the decode worker speculates.
    ("disaggregated", ["--max-local-prefill-tokens=0"], "ngram"),
    # The prompt's head KV comes with the hand-off (the prefill worker runs the head too).
    ("disaggregated", ["--max-local-prefill-tokens=0"], "eagle3"),
])
def test_greedy_through_serve_equals_no_speculation(model, prompts, expected, specs, mode,
                                                    router_args, method):
    stack = start_stack(model, mode, worker_arg=("--num-kv-blocks=256", specs[method]),
                        router_args=router_args, gateway_args=["--slos="])
    try:
        assert answers(stack, model, prompts) == expected
        decode = stack.workers("mixed" if mode == "colocated" else "decode")
        assert sum(metric(w, "baton_spec_decode_num_drafts_total") for w in decode) > 0
        if mode == "disaggregated":
            assert sum(metric(w, "baton_spec_decode_num_drafts_total")
                       for w in stack.workers("prefill")) == 0
    finally:
        stack.stop()
