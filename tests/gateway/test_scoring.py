"""Scoring through the whole stack with the official `openai` client, in both modes: echo with
logprobs and max_tokens 0 (lm-evaluation-harness's log-likelihood request), vLLM's prompt_logprobs,
and logit_bias. Prompt logprobs are checked against transformers' log_softmax on the same checkpoint
(the workers run float32 on CPU)."""
from __future__ import annotations

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.launcher import metric

ATOL = 1e-4
# 50 tokens: three full blocks of 16 and a tail
PROMPT = list(range(100, 140)) + list(range(300, 310))


@pytest.fixture(scope="module", params=["handoff", "colocated"])
def scoring_stack(request):
    """Disaggregated with every prompt handed off, so the prefill worker scores it, and
    colocated."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def client(scoring_stack):
    return openai.OpenAI(base_url=scoring_stack.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def reference(model):
    hf = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([PROMPT])).logits[0].float().log_softmax(dim=-1)


def test_echo_logprobs_with_max_tokens_0_match_transformers(client, scoring_stack, model,
                                                            reference):
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    # Disaggregated, the prefill worker scores the prompt; colocated, the only worker does.
    scorer = (scoring_stack.workers("prefill") or scoring_stack.workers())[0]
    computed = metric(scorer, "baton_prompt_tokens_computed_total")
    kwargs = dict(model=model.name, prompt=PROMPT, max_tokens=0, echo=True, logprobs=2,
                  temperature=0)
    # the prompt's blocks are now cached; scoring must not skip them
    client.completions.create(**kwargs)
    out = client.completions.create(**kwargs)
    assert metric(scorer, "baton_prompt_tokens_computed_total") - computed == 2 * len(PROMPT)
    choice = out.choices[0]
    assert choice.text == tokenizer.decode(PROMPT) and choice.finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(PROMPT), 0)
    lp = choice.logprobs
    assert lp.tokens == [tokenizer.decode([t]) for t in PROMPT]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected = [float(reference[p, PROMPT[p + 1]]) for p in range(len(PROMPT) - 1)]
    assert lp.token_logprobs[1:] == pytest.approx(expected, abs=ATOL)
    for p, top in enumerate(lp.top_logprobs[1:]):
        # The top 2 plus the prompt's own token, keyed by text: byte fragments that render alike
        # share a key, which the best-ranked keeps.
        assert 1 <= len(top) <= 3
        assert max(top.values()) == pytest.approx(float(reference[p].max()), abs=ATOL)
        assert top[lp.tokens[p + 1]] >= lp.token_logprobs[p + 1] - ATOL
    offsets = [0] + [sum(len(t) for t in lp.tokens[:i]) for i in range(1, len(PROMPT))]
    assert lp.text_offset == offsets


def test_vllm_prompt_logprobs_on_completions_and_chat(client, model, reference):
    out = client.completions.create(model=model.name, prompt=PROMPT, max_tokens=3, temperature=0,
                                    extra_body={"prompt_logprobs": 1})
    scored = out.choices[0].model_extra["prompt_logprobs"]
    assert scored[0] is None and len(scored) == len(PROMPT)
    for p, position in enumerate(scored[1:]):
        own = position[str(PROMPT[p + 1])]
        assert own["logprob"] == pytest.approx(float(reference[p, PROMPT[p + 1]]), abs=ATOL)
        assert own["rank"] == int((reference[p] > reference[p, PROMPT[p + 1]]).sum()) + 1
    assert out.usage.completion_tokens == 3
    chat = client.chat.completions.create(model=model.name,
                                          messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=2, extra_body={"prompt_logprobs": 0})
    scored = chat.model_extra["prompt_logprobs"]
    assert scored[0] is None and len(scored) == chat.usage.prompt_tokens
    assert all(len(position) == 1 for position in scored[1:])


def test_logit_bias_forces_and_bans_tokens(client, model):
    kwargs = dict(model=model.name, prompt=PROMPT, max_tokens=4, temperature=0,
                  extra_body={"ignore_eos": True, "return_token_ids": True})
    plain = client.completions.create(**kwargs).choices[0].model_extra["token_ids"]
    forced = client.completions.create(**kwargs,
                                       logit_bias={"7": 100}).choices[0].model_extra["token_ids"]
    assert plain != [7] * 4 and forced == [7] * 4
    banned = client.completions.create(**kwargs, logit_bias={str(t): -100 for t in set(plain)})
    assert not set(banned.choices[0].model_extra["token_ids"]) & set(plain)


@pytest.mark.parametrize("extra", [{"logit_bias": {"512": 1}}, {"logit_bias": {"5": 150}},
                                   {"logit_bias": {"five": 1}}])
def test_bad_logit_bias_is_a_400(client, model, extra):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model.name, prompt="x", max_tokens=2, **extra)
    assert info.value.body["param"] == "logit_bias"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model.name, messages=[{"role": "user",
                                                                    "content": "x"}], max_tokens=2,
                                       **extra)


def test_max_tokens_0_without_echo_is_a_400(client, model):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model.name, prompt="x", max_tokens=0)
    assert info.value.body["param"] == "max_tokens"


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_streamed_echo_matches_the_whole_answer(client, model, max_tokens):
    kwargs = dict(model=model.name, prompt="Once upon a time", max_tokens=max_tokens, echo=True,
                  logprobs=1, temperature=0)
    whole = client.completions.create(**kwargs)
    chunks = [
        c for c in client.completions.create(**kwargs, stream=True,
                                             stream_options={"include_usage": True}) if c.choices
    ]
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    joined = {
        field: sum((getattr(c.choices[0].logprobs, field)
                    for c in chunks if c.choices[0].logprobs), [])
        for field in ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    }
    assert joined == whole.choices[0].logprobs.model_dump()
