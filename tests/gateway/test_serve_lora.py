"""`baton serve MODEL --lora-modules ...` in both modes and colocated at tensor parallelism 2: three
PEFT adapters of different ranks and targets and the base model, asked at once through the
official client, answer greedily what transformers + peft answer, token for token; /v1/models
lists the adapters under their base; a model nobody serves is a 404 and the server goes on
serving."""
from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.engine.engine_helpers import random_prompts
from tests.engine.lora_helpers import (assert_matches, greedy_reference, make_adapters,
                                       reference_model)
from tests.launcher import ServeCommand, wait_for

NEW_TOKENS = 10
# A stack with two engine ranks starting on a loaded 2-core machine: generous bounds.
pytestmark = pytest.mark.timeout(900)
# Disaggregated: every prompt is prefilled on the prefill worker and handed off, so the decode
# worker runs the adapter the hand-off names. TP=2: the worker's second rank fills its slots as
# the first one does.
MODES = {"colocated": ["--mode", "colocated"],
         "disaggregated": ["--mode", "disaggregated", "--router-arg=--max-local-prefill-tokens=0"],
         "colocated-tp2": ["--mode", "colocated", "-tp", "2"]}


@pytest.fixture(scope="module")
def lora_case(tiny_model_dirs, tmp_path_factory) -> dict:
    model_dir = tiny_model_dirs["llama"]
    adapters = make_adapters(model_dir, tmp_path_factory.mktemp("serve-adapters"))
    prompts = random_prompts(2, 200, seed=11, min_len=5, max_len=30)
    want = {name: [greedy_reference(reference_model(model_dir, adapters.get(name)), p,
                                    NEW_TOKENS) for p in prompts]
            for name in ["llama", *adapters]}
    return {"model": model_dir, "adapters": adapters, "prompts": prompts, "want": want}


@pytest.fixture(scope="module", params=list(MODES))
def served(request, lora_case):
    modules = [f"{name}={path}" for name, path in lora_case["adapters"].items()]
    # The JSON form too, naming its base model.
    name, path = modules.pop().split("=")
    modules.append(json.dumps({"name": name, "path": path, "base_model_name": "llama"}))
    serve = ServeCommand(str(lora_case["model"]), *MODES[request.param], "--dtype", "float32",
                         "--max-loras", "2", "--worker-arg=--num-kv-blocks=256",
                         "--lora-modules", *modules)
    try:
        assert serve.ready.wait(480), "\n".join(serve.lines)
        yield serve
    finally:
        serve.stop()


def _models(serve: ServeCommand) -> list[dict]:
    return json.loads(urllib.request.urlopen(serve.url + "/models", timeout=10).read())["data"]


def test_models_lists_adapters_under_the_base(served, lora_case) -> None:
    wait_for(lambda: len(_models(served)) == 4, timeout=60, what="the adapters in /v1/models")
    models = {m["id"]: m for m in _models(served)}
    assert models["llama"]["parent"] is None
    for name in lora_case["adapters"]:
        assert (models[name]["parent"], models[name]["root"]) == ("llama", name)


def test_adapters_and_base_at_once_match_peft(served, lora_case) -> None:
    wait_for(lambda: len(_models(served)) == 4, timeout=60, what="the adapters in /v1/models")
    client = openai.OpenAI(base_url=served.url, api_key="none", max_retries=0, timeout=240)
    jobs = [(name, i) for name in lora_case["want"] for i in range(len(lora_case["prompts"]))]

    def ask(job: tuple[str, int]) -> tuple[str, list[int]]:
        name, i = job
        answer = client.completions.create(
            model=name, prompt=lora_case["prompts"][i], max_tokens=NEW_TOKENS, temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True})
        return answer.model, answer.choices[0].model_extra["token_ids"]

    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(ask, jobs))
    for (name, i), (model, tokens) in zip(jobs, answers):
        assert model == name
        want, gaps = lora_case["want"][name][i]
        assert_matches(tokens, want, gaps, f"{name} prompt {i}")


def test_unknown_model_is_404_and_serving_goes_on(served) -> None:
    wait_for(lambda: len(_models(served)) == 4, timeout=60, what="the adapters in /v1/models")
    client = openai.OpenAI(base_url=served.url, api_key="none", max_retries=0, timeout=240)
    with pytest.raises(openai.NotFoundError) as refused:
        client.completions.create(model="no-such-adapter", prompt="hi", max_tokens=2)
    assert refused.value.body["code"] == "model_not_found"
    assert "no-such-adapter" in refused.value.body["message"]
    answer = client.completions.create(model="qv8", prompt="hi", max_tokens=2, temperature=0)
    assert answer.usage.completion_tokens == 2
