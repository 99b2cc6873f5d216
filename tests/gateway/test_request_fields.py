"""The request fields current OpenAI clients and vLLM users send, through a whole stack (two
colocated workers) with the official `openai` client: the developer role with prompt_cache_key and
safety_identifier, one cache key kept on one worker, batched prompts, usage in every chunk, token
ids as logprob names, whole-vocabulary logprobs, template flags and echo, forced tool calls whose
schemas use references, and unknown fields (refused here, where strict checking is on; ignored with
a warning on the default stack)."""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.launcher import metric, start_stack, wait_for

VOCAB = 512  # the tiny model's
DEVELOPER = [{"role": "developer", "content": "Answer in one word."},
             {"role": "user", "content": "Name a color."}]
PLACE = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
         "required": ["city"], "additionalProperties": False}
LOCATED = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "$defs": {"place": PLACE},
    "properties": {"where": {"$ref": "#/$defs/place"}}, "required": ["where"],
    "additionalProperties": False}}}


@pytest.fixture(scope="module")
def fields_stack(model):
    # Stats never count as stale here: on a loaded machine a late report would mark the key's
    # worker saturated and move the key for reasons the test is not about.
    logprobs = "--max-logprobs=-1"
    stack = start_stack(model, "colocated", decode_workers=2,
                        worker_arg=("--num-kv-blocks=512", logprobs),
                        router_args=["--stats-max-age-s=120"],
                        gateway_args=["--slos=", "--strict-request-fields", logprobs,
                                      "--return-tokens-as-token-ids"])
    yield stack
    stack.stop()


@pytest.fixture
def fields(fields_stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=fields_stack.url, api_key="unused", max_retries=0)


def finished(stack) -> list[float]:
    return [metric(w, "baton_request_success_total") for w in stack.workers()]


def test_developer_message_with_cache_key_and_safety_identifier(fields, fields_stack, model):
    reply = fields.chat.completions.create(
        model=model.name, messages=DEVELOPER, prompt_cache_key="conversation-1",
        safety_identifier="user-hash-77", user="u-1", metadata={"team": "search"},
        reasoning_effort="low", verbosity="low", max_completion_tokens=4, temperature=0)
    assert reply.choices[0].message.role == "assistant" and reply.usage.completion_tokens >= 1
    assert "prompt_logprobs" in reply.model_extra and reply.model_extra["prompt_logprobs"] is None
    # the end user and the metadata reach the usage line, for whoever bills the tenant
    wait_for(lambda: any(reply.id in line and "end user user-hash-77" in line
                         and '"team": "search"' in line
                         for line in list(fields_stack.gateway.output)),
             timeout=30, what="the usage line")


def test_one_prompt_cache_key_stays_on_one_worker(fields, fields_stack, model):
    before = finished(fields_stack)
    for i, word in enumerate(["Apples", "Rivers", "Engines", "Violins", "Glaciers"]):
        # prompts that differ from their first token: no cached prefix holds them together
        fields.chat.completions.create(
            model=model.name, messages=[{"role": "user", "content": f"{word} {i} " * 20}],
            prompt_cache_key="shared-key", max_tokens=2, temperature=0)
    wait_for(lambda: sum(finished(fields_stack)) - sum(before) >= 5, timeout=30,
             what="the workers counting the requests")
    served = [after - b for after, b in zip(finished(fields_stack), before)]
    assert sorted(served) == [0, 5], served


def test_strict_checking_refuses_unknown_fields(fields, model):
    with pytest.raises(openai.BadRequestError) as info:
        fields.completions.create(model=model.name, prompt="x", max_tokens=1,
                                  extra_body={"frobnicate": 1})
    assert info.value.body["code"] == "unknown_parameter" and info.value.body["param"] == \
        "frobnicate"


def test_unknown_fields_are_ignored_with_a_warning_by_default(colocated, model):
    client = openai.OpenAI(base_url=colocated.url, api_key="unused", max_retries=0)
    reply = client.completions.create(model=model.name, prompt="x", max_tokens=1,
                                      extra_body={"frobnicate_7": 1})
    assert reply.choices[0].finish_reason == "length"
    wait_for(lambda: any("frobnicate_7" in line and "ignored" in line
                         for line in list(colocated.gateway.output)),
             timeout=30, what="the warning")


@pytest.mark.parametrize("prompt", [["Once upon", "a time"], [[5, 6, 7], [8, 9]]])
def test_a_list_of_prompts_answers_each_n_times(fields, model, prompt):
    reply = fields.completions.create(model=model.name, prompt=prompt, n=2, max_tokens=2,
                                      temperature=0, echo=True)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    first = prompt[0] if isinstance(prompt[0], str) else None
    if first is not None:
        assert all(c.text.startswith(first) for c in reply.choices[:2])
        assert all(c.text.startswith(prompt[1]) for c in reply.choices[2:])
    # greedy: both samples of a prompt agree
    assert reply.choices[0].text == reply.choices[1].text
    assert reply.usage.completion_tokens == 8
    stream = fields.completions.create(model=model.name, prompt=prompt, n=2, max_tokens=2,
                                       temperature=0, stream=True)
    ends = {c.index: c.finish_reason for chunk in stream for c in chunk.choices if c.finish_reason}
    assert ends == {0: "length", 1: "length", 2: "length", 3: "length"}


def test_continuous_usage_stats_count_up_in_every_chunk(fields, model):
    stream = fields.chat.completions.create(
        model=model.name, messages=DEVELOPER, max_tokens=3, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = list(stream)
    counted = [c.usage.completion_tokens for c in chunks if c.choices]
    assert all(c.usage is not None for c in chunks)
    assert counted == sorted(counted) and counted[0] == 0 and counted[-1] == 3
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3


def test_tokens_as_token_ids_by_server_flag_and_request(fields, model):
    named = fields.completions.create(model=model.name, prompt="Hello", max_tokens=3, logprobs=2,
                                      temperature=0)
    assert all(t.startswith("token_id:") for t in named.choices[0].logprobs.tokens)
    text = fields.completions.create(model=model.name, prompt="Hello", max_tokens=3, logprobs=2,
                                     temperature=0,
                                     extra_body={"return_tokens_as_token_ids": False})
    assert not any(t.startswith("token_id:") for t in text.choices[0].logprobs.tokens)
    ids = [int(t.removeprefix("token_id:")) for t in named.choices[0].logprobs.tokens]
    assert named.choices[0].text == text.choices[0].text and len(ids) == 3


def test_minus_one_logprobs_cover_the_whole_vocabulary(fields, model):
    reply = fields.chat.completions.create(model=model.name, messages=DEVELOPER, max_tokens=2,
                                           logprobs=True, top_logprobs=-1, temperature=0)
    assert [len(e.top_logprobs) for e in reply.choices[0].logprobs.content] == [VOCAB, VOCAB]
    scored = fields.completions.create(model=model.name, prompt=[5, 6, 7], max_tokens=1,
                                       extra_body={"prompt_logprobs": -1})
    positions = scored.choices[0].model_extra["prompt_logprobs"]
    assert positions[0] is None and [len(p) for p in positions[1:]] == [VOCAB, VOCAB]


def test_template_flags_echo_and_other_roles(fields, model):
    continued = fields.chat.completions.create(
        model=model.name, temperature=0, max_tokens=3,
        messages=[{"role": "user", "content": "Name a color."},
                  {"role": "assistant", "content": "Blu"}],
        extra_body={"add_generation_prompt": False, "continue_final_message": True,
                    "echo": True, "chat_template_kwargs": {"enable_thinking": False}})
    assert continued.choices[0].message.content.startswith("Blu")
    other = fields.chat.completions.create(
        model=model.name, temperature=0, max_tokens=2,
        messages=[*DEVELOPER, {"role": "ipython", "content": "42"}])
    assert other.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as info:
        fields.chat.completions.create(model=model.name, max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "image_url",
                                          "image_url": {"url": "http://x/y.png"}}]}])
    assert info.value.body["param"] == "messages[0].content"
    assert "text-only" in info.value.body["message"]


def test_required_tool_choice_with_references(fields, model):
    reply = fields.chat.completions.create(
        model=model.name, messages=DEVELOPER, tools=[LOCATED], tool_choice="required",
        parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=3)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "weather"
    jsonschema.validate(json.loads(call.function.arguments), {
        "$defs": {"place": PLACE}, "type": "object",
        "properties": {"where": {"$ref": "#/$defs/place"}}, "required": ["where"]})


def test_a_cut_required_call_answers_as_its_stream_does(fields, model):
    kwargs = dict(model=model.name, messages=DEVELOPER, tools=[LOCATED], tool_choice="required",
                  max_tokens=12, temperature=0)
    whole = fields.chat.completions.create(**kwargs).choices[0]
    calls: dict[int, dict[str, str]] = {}
    content, finish = "", None
    for chunk in fields.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            finish = c.finish_reason or finish
            for call in c.delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
    assert whole.finish_reason == finish == "length"
    made = [{"name": c.function.name, "arguments": c.function.arguments}
            for c in whole.message.tool_calls or []]
    assert made == [calls[i] for i in sorted(calls)]
    assert (whole.message.content or "") == content
