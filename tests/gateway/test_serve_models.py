"""`baton serve --model A --model B`: two base models of different shapes and vocabularies behind
one gateway, each with its own prefill and decode workers. Through the official client, requests
for both at once answer greedily what transformers answers on that model's checkpoint (so each
ran on its own pool, tokenized by its own tokenizer, and handed off between its own workers);
/v1/models lists both with their own limits; an unknown model is a 404 and serving goes on."""
from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
from transformers import AutoTokenizer

from baton.services.checkpoints.tiny_model import TinyModelSpec, make_tiny_model
from tests.engine.lora_helpers import assert_matches, greedy_reference, reference_model
from tests.launcher import ServeCommand, wait_for

NEW_TOKENS = 8
PROMPTS = ["Once upon a time", "The quick brown fox jumps over", "Serving two models at once"]


@pytest.fixture(scope="module")
def checkpoints(tiny_model_dirs, tmp_path_factory) -> dict[str, Path]:
    """The session's tiny Llama, and a Qwen3 of another depth, vocabulary and context length."""
    beta = make_tiny_model(tmp_path_factory.mktemp("beta") / "beta", TinyModelSpec.preset(
        "qwen3", vocab_size=700, num_layers=3, max_position_embeddings=512, seed=7))
    return {"alpha": tiny_model_dirs["llama"], "beta": beta}


@pytest.fixture(scope="module")
def want(checkpoints) -> dict[str, list[tuple[list[int], list[int], list[float]]]]:
    """Per model and prompt: its prompt ids under the model's own tokenizer, and transformers'
    greedy tokens with their top-2 gaps."""
    cases = {}
    for name, path in checkpoints.items():
        tokenizer, model = AutoTokenizer.from_pretrained(str(path)), reference_model(path, None)
        ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
        cases[name] = [(p, *greedy_reference(model, p, NEW_TOKENS)) for p in ids]
    return cases


@pytest.fixture(scope="module")
def served(checkpoints):
    # Every prompt prefilled on its model's prefill worker and handed off to its decode worker.
    serve = ServeCommand("--model", str(checkpoints["alpha"]), "--model", str(checkpoints["beta"]),
                         "--served-model-name", "alpha", "--served-model-name", "beta",
                         "--dtype", "float32", "--worker-arg=--num-kv-blocks=256",
                         "--router-arg=--max-local-prefill-tokens=0")
    try:
        assert serve.ready.wait(600), "\n".join(serve.lines)
        yield serve
    finally:
        serve.stop()


def _models(serve: ServeCommand) -> dict[str, dict]:
    body = json.loads(urllib.request.urlopen(serve.url + "/models", timeout=30).read())
    return {m["id"]: m for m in body["data"]}


def test_each_model_answers_from_its_own_pool(served, want) -> None:
    client = openai.OpenAI(base_url=served.url, api_key="none", max_retries=0, timeout=240)
    jobs = [(name, i) for name in want for i in range(len(PROMPTS))]

    def ask(job: tuple[str, int]) -> tuple[str, int, list[int]]:
        name, i = job
        answer = client.completions.create(
            model=name, prompt=PROMPTS[i], max_tokens=NEW_TOKENS, temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True})
        return (answer.model, answer.usage.prompt_tokens,
                answer.choices[0].model_extra["token_ids"])

    with ThreadPoolExecutor(len(jobs)) as pool:  # at once: both pools busy together
        answers = list(pool.map(ask, jobs))
    for (name, i), (model, prompt_tokens, tokens) in zip(jobs, answers):
        prompt, greedy, gaps = want[name][i]
        assert (model, prompt_tokens) == (name, len(prompt)), (name, i)
        assert_matches(tokens, greedy, gaps, f"{name} prompt {i}")
    # the two tokenizers differ, so a prompt tokenized by the wrong one would show
    assert [len(c[0]) for c in want["alpha"]] != [len(c[0]) for c in want["beta"]]


def test_models_lists_both_with_their_own_limits(served, checkpoints) -> None:
    models = _models(served)
    assert set(models) == {"alpha", "beta"}
    assert (models["alpha"]["max_model_len"], models["beta"]["max_model_len"]) == (2048, 512)
    assert models["beta"]["root"] == str(checkpoints["beta"]) and models["beta"]["parent"] is None


def test_an_unknown_model_is_a_404_and_serving_goes_on(served) -> None:
    client = openai.OpenAI(base_url=served.url, api_key="none", max_retries=0, timeout=240)
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gamma", prompt="hi", max_tokens=2)
    assert missing.value.body["code"] == "model_not_found"
    assert "`alpha`" in missing.value.body["message"] and "`beta`" in missing.value.body["message"]
    answer = client.completions.create(model="beta", prompt="hi", max_tokens=2, temperature=0)
    assert answer.model == "beta" and answer.usage.completion_tokens == 2


def test_tokenize_uses_the_named_models_tokenizer(served, want) -> None:
    for name in want:
        request = urllib.request.Request(
            served.url.removesuffix("/v1") + "/tokenize", method="POST",
            data=json.dumps({"model": name, "prompt": PROMPTS[1]}).encode(),
            headers={"Content-Type": "application/json"})
        body = json.loads(urllib.request.urlopen(request, timeout=30).read())
        assert body["tokens"] == want[name][1][0]
