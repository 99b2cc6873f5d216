"""The request fields current OpenAI clients and vLLM users send (issue 27, items 2, 3b and 5),
parsed, rendered and answered with no model running: roles, template variables, unknown fields,
batched prompts, usage in every chunk, token ids as logprob names, whole-vocabulary logprobs, and
forced tool calls whose schemas use references or are cut off by max_tokens."""
from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from transformers import AutoTokenizer

from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.openai.endpoints import parse_request
from baton.services.openai.engine_input import to_engine_input
from baton.services.openai.errors import ProtocolError
from baton.services.openai.render import Choice, build_response
from baton.services.openai.streaming import ChatChunkWriter, CompletionChunkWriter

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "Name a color."}]
# A template that shows the variables a request can set, as reasoning models' templates read them.
VARIABLES_TEMPLATE = (
    "effort={{ reasoning_effort }} verbosity={{ verbosity }} thinking={{ enable_thinking }}|"
    "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dirs):
    return AutoTokenizer.from_pretrained(str(tiny_model_dirs["llama"]))


@pytest.fixture(scope="module")
def variables_tokenizer(tokenizer):
    shown = copy.deepcopy(tokenizer)
    shown.chat_template = VARIABLES_TEMPLATE
    return shown


def prompt_text(tokenizer, body, url=CHAT, max_model_len=512) -> str:
    inp = to_engine_input(parse_request(url, body), tokenizer, max_model_len)
    return tokenizer.decode(inp.prompts[0])


def refusal(url, body, tokenizer=None, **kw) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        request = parse_request(url, body, kw.pop("strict", False))
        if tokenizer is not None:
            to_engine_input(request, tokenizer, 512, **kw)
    assert info.value.status == 400
    return info.value


# -- item 2: roles and the fields current clients send ---------------------------------------------

def test_developer_is_system_for_a_template_without_it(tokenizer):
    as_system = prompt_text(tokenizer, {"messages": [{"role": "system", "content": "Be terse."},
                                                     *USER]})
    assert prompt_text(tokenizer, {"messages": [{"role": "developer", "content": "Be terse."},
                                                *USER]}) == as_system
    assert "<|im_start|>system\nBe terse." in as_system


def test_developer_stays_for_a_template_that_knows_it(variables_tokenizer):
    variables_tokenizer = copy.deepcopy(variables_tokenizer)
    variables_tokenizer.chat_template += "{# developer #}"
    text = prompt_text(variables_tokenizer, {"messages": [{"role": "developer", "content": "x"}]})
    assert "developer:x;" in text


def test_other_roles_reach_the_template(tokenizer):
    text = prompt_text(tokenizer, {"messages": [*USER, {"role": "ipython", "content": "42"}]})
    assert "<|im_start|>ipython\n42<|im_end|>" in text


def test_client_fields_are_accepted_and_kept(tokenizer):
    body = {"messages": USER, "prompt_cache_key": "conversation-7", "safety_identifier": "hash-1",
            "user": "u-2", "metadata": {"team": "search"}, "reasoning_effort": "low",
            "verbosity": "high", "store": False, "service_tier": "auto"}
    request = parse_request(CHAT, body)
    assert (request.prompt_cache_key, request.end_user(), request.metadata) == (
        "conversation-7", "hash-1", {"team": "search"})
    assert parse_request(CHAT, {"messages": USER, "user": "u-2"}).end_user() == "u-2"
    assert to_engine_input(request, tokenizer, 512).prompts[0]


@pytest.mark.parametrize("extra,param", [
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"metadata": {"k": "v" * 513}}, "metadata"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"verbosity": 3}, "verbosity"),
    ({"prompt_cache_key": ""}, "prompt_cache_key"),
])
def test_bad_client_fields_name_themselves(extra, param):
    assert refusal(CHAT, {"messages": USER, **extra}).param == param


def test_template_variables_reach_the_template(variables_tokenizer):
    text = prompt_text(variables_tokenizer, {"messages": USER, "reasoning_effort": "high",
                                             "verbosity": "low"})
    assert text.startswith("effort=high verbosity=low thinking=|")
    # chat_template_kwargs are the template's own; they win over the fields they repeat
    text = prompt_text(variables_tokenizer, {
        "messages": USER, "reasoning_effort": "high",
        "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "medium"}})
    assert text.startswith("effort=medium verbosity= thinking=False|")


def test_template_kwargs_cannot_override_what_the_server_sets():
    error = refusal(CHAT, {"messages": USER, "chat_template_kwargs": {"tokenize": True}})
    assert error.param == "chat_template_kwargs" and "`tokenize`" in error.message


@pytest.mark.parametrize("kind,what", [("image_url", "images"), ("input_audio", "audio")])
def test_media_parts_are_refused_naming_the_field_and_why(kind, what):
    part = {"type": kind, kind: {"url": "http://x/y"}}
    error = refusal(CHAT, {"messages": [{"role": "user", "content": [part]}]})
    assert error.param == "messages[0].content"
    assert f"'{kind}'" in error.message and f"text-only and reads no {what}" in error.message


def test_unknown_fields_are_ignored_unless_strict():
    request = parse_request(COMPLETIONS, {"prompt": "x", "frobnicate": 1, "zeta": None})
    assert request.ignored_fields == ["frobnicate"]  # a null is a default, not a field
    error = refusal(COMPLETIONS, {"prompt": "x", "frobnicate": 1}, strict=True)
    assert (error.param, error.code) == ("frobnicate", "unknown_parameter")
    # fields known but not served are still refused when they ask for something
    assert refusal(COMPLETIONS, {"prompt": "x", "suffix": "end"}).code == "unsupported_parameter"


# -- item 3b: the template's own flags, echo -------------------------------------------------------

def test_add_generation_prompt_and_continue_final_message(variables_tokenizer, tokenizer):
    messages = [*USER, {"role": "assistant", "content": "Blu"}]
    closed = prompt_text(variables_tokenizer, {"messages": messages,
                                               "add_generation_prompt": False})
    assert closed.endswith("assistant:Blu;")
    continued = prompt_text(tokenizer, {"messages": messages, "add_generation_prompt": False,
                                        "continue_final_message": True})
    assert continued.endswith("<|im_start|>assistant\nBlu")  # left open for the model to go on
    both = refusal(CHAT, {"messages": messages, "continue_final_message": True})
    assert both.param == "continue_final_message" and "add_generation_prompt" in both.message
    not_assistant = refusal(CHAT, {"messages": USER, "add_generation_prompt": False,
                                   "continue_final_message": True})
    assert "assistant" in not_assistant.message


def _choice(token_ids, text="out", finish="length", prompt=(1, 2, 3), logprobs=None,
            index=0) -> Choice:
    out = RequestOutput(request_id="r", prompt_token_ids=list(prompt), token_ids=token_ids,
                        text=text, num_new_tokens=1, new_text="", finished=True,
                        finish_reason=finish, stop_reason=None, logprobs=logprobs)
    return Choice.of(out, index)


def test_chat_echo_starts_with_the_message_it_continues(tokenizer):
    continued = {"messages": [*USER, {"role": "assistant", "content": "Blu"}], "echo": True,
                 "add_generation_prompt": False, "continue_final_message": True}
    request = parse_request(CHAT, continued)
    body = build_response(request, [_choice([5], "e.")], tokenizer, "tiny")
    assert body["choices"][0]["message"]["content"] == "Blue."
    writer = ChatChunkWriter(request, "id", "tiny", None)
    opening = json.loads(writer.opening([_choice([])])[0].removeprefix("data: "))
    assert opening["choices"][0]["delta"] == {"role": "assistant", "content": "Blu"}
    # a new assistant message echoes nothing: the last message is the user's
    fresh = parse_request(CHAT, {"messages": USER, "echo": True})
    assert build_response(fresh, [_choice([5], "Red")], tokenizer, "tiny")[
        "choices"][0]["message"]["content"] == "Red"


def test_chat_responses_carry_prompt_logprobs_null(tokenizer):
    body = build_response(parse_request(CHAT, {"messages": USER}), [_choice([5])], tokenizer, "t")
    assert "prompt_logprobs" in body and body["prompt_logprobs"] is None


# -- item 3b: batched prompts ----------------------------------------------------------------------

@pytest.mark.parametrize("prompt", [["Once", "upon a time"], [[7, 8], [9, 10, 11]]])
def test_a_list_of_prompts_is_one_choice_per_prompt_and_n(tokenizer, prompt):
    request = parse_request(COMPLETIONS, {"prompt": prompt, "n": 2, "max_tokens": 3,
                                          "echo": True})
    inp = to_engine_input(request, tokenizer, 512)
    assert inp.choices == 4 and [inp.prompt_of(i) for i in range(4)] == [
        inp.prompts[0], inp.prompts[0], inp.prompts[1], inp.prompts[1]]
    if isinstance(prompt[0], list):
        assert inp.prompts == prompt
    choices = [_choice([5], f"-{i}", prompt=inp.prompt_of(i), index=i) for i in range(4)]
    body = build_response(request, choices, tokenizer, "tiny")
    texts = [tokenizer.decode(p) if isinstance(p, list) else p for p in prompt]
    assert [(c["index"], c["text"]) for c in body["choices"]] == [
        (0, texts[0] + "-0"), (1, texts[0] + "-1"), (2, texts[1] + "-2"), (3, texts[1] + "-3")]
    assert body["usage"]["prompt_tokens"] == inp.prompt_tokens == sum(map(len, inp.prompts))
    assert body["usage"]["completion_tokens"] == 4


@pytest.mark.parametrize("prompt", [[], [[]], [["a"]], [1, "a"], [True]])
def test_malformed_prompt_lists_are_refused(tokenizer, prompt):
    assert refusal(COMPLETIONS, {"prompt": prompt}, tokenizer).param == "prompt"


def test_every_prompt_of_a_batch_must_fit_the_context(tokenizer):
    error = refusal(COMPLETIONS, {"prompt": [[1, 2], list(range(1, 600))], "max_tokens": 1},
                    tokenizer)
    assert error.code == "context_length_exceeded"


# -- item 3b: streaming usage, token ids, whole-vocabulary logprobs --------------------------------

def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(tokenizer):
    from baton.services.openai.render import TokenText
    from baton.services.openai.streaming import Delta
    request = parse_request(COMPLETIONS, {"prompt": [1, 2, 3], "stream": True, "stream_options": {
        "include_usage": True, "continuous_usage_stats": True}})
    writer = CompletionChunkWriter(request, "id", "tiny", TokenText(tokenizer))
    state = _choice([5, 6], "ab", finish=None)
    chunk = json.loads(writer.delta(state, Delta("b", [6], [], False)).removeprefix("data: "))
    assert chunk["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                              "prompt_tokens_details": {"cached_tokens": 0}}
    plain = parse_request(COMPLETIONS, {"prompt": [1, 2, 3], "stream": True,
                                        "stream_options": {"include_usage": True}})
    chunk = CompletionChunkWriter(plain, "id", "tiny", TokenText(tokenizer)).delta(
        state, Delta("b", [6], [], False))
    assert "usage" not in json.loads(chunk.removeprefix("data: "))


def test_tokens_as_token_ids_name_logprobs_by_id(tokenizer):
    logprobs = [TokenLogprobs(token_id=300, logprob=-1.0, rank=2, top={301: -0.5})]
    chat = parse_request(CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 1,
                                "return_tokens_as_token_ids": True})
    entry = build_response(chat, [_choice([300], logprobs=logprobs)], tokenizer, "t")[
        "choices"][0]["logprobs"]["content"][0]
    assert entry["token"] == "token_id:300" and entry["top_logprobs"][0]["token"] == "token_id:301"
    completion = parse_request(COMPLETIONS, {"prompt": "x", "logprobs": 1,
                                             "return_tokens_as_token_ids": True})
    lp = build_response(completion, [_choice([300], logprobs=logprobs)], tokenizer, "t")[
        "choices"][0]["logprobs"]
    assert lp["tokens"] == ["token_id:300"]
    assert lp["top_logprobs"][0] == {"token_id:301": -0.5, "token_id:300": -1.0}
    # unset, it is the server's choice (the gateway fills it in); false names them by text
    assert parse_request(CHAT, {"messages": USER}).return_tokens_as_token_ids is None


def test_minus_one_asks_for_the_whole_vocabulary(tokenizer):
    vocab = len(tokenizer)
    chat = parse_request(CHAT, {"messages": USER, "logprobs": True, "top_logprobs": -1,
                                "prompt_logprobs": -1, "max_tokens": 1})
    inp = to_engine_input(chat, tokenizer, 512, max_logprobs=-1, vocab_size=vocab)
    assert inp.params.logprobs == vocab and inp.params.prompt_logprobs == vocab
    # a server that caps logprobs refuses it, naming the field
    error = refusal(CHAT, {"messages": USER, "logprobs": True, "top_logprobs": -1}, tokenizer,
                    max_logprobs=20, vocab_size=vocab)
    assert error.param == "top_logprobs" and f"got {vocab}" in error.message
    assert refusal(CHAT, {"messages": USER, "logprobs": True, "top_logprobs": -2}).param == \
        "top_logprobs"


# -- item 3b and 5: forced tool calls --------------------------------------------------------------

LOCATED = {
    "type": "function", "function": {
        "name": "weather", "parameters": {
            "type": "object", "$defs": {"place": {"type": "object", "properties": {
                "city": {"type": "string"}}, "required": ["city"]}},
            "properties": {"where": {"$ref": "#/$defs/place"},
                           "also": {"type": "array", "items": {"$ref": "#/$defs/place"}}},
            "required": ["where"]}}}
PLAIN = {"type": "function", "function": {"name": "time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}


def test_required_tool_choice_keeps_each_schemas_references(tokenizer):
    request = parse_request(CHAT, {"messages": USER, "tools": [PLAIN, LOCATED],
                                   "tool_choice": "required", "max_tokens": 8})
    structured = to_engine_input(request, tokenizer, 2048).params.structured_output
    schema = json.loads(structured.value)
    good = [{"name": "weather", "arguments": {"where": {"city": "Paris"}, "also": [
        {"city": "Lyon"}]}}, {"name": "time", "arguments": {"zone": "UTC"}}]
    jsonschema.validate(good, schema)  # every reference resolves in the combined document
    bad = [{"name": "weather", "arguments": {"where": {"town": "Paris"}}}]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_a_required_call_cut_by_max_tokens_is_a_tool_call_with_finish_length(tokenizer):
    request = parse_request(CHAT, {"messages": USER, "tools": [LOCATED],
                                   "tool_choice": "required", "max_tokens": 8})
    text = '[{"name": "weather", "arguments": {"where": {"ci'
    choice = build_response(request, [_choice([5] * 8, text, "length")], tokenizer, "t")[
        "choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "weather", "arguments": '{"where": {"ci'}
    # the streamed answer carries the same call
    writer = ChatChunkWriter(request, "id", "t", None)
    from baton.services.openai.streaming import Delta
    chunk = json.loads(writer.delta(_choice([5] * 8, text, "length"),
                                    Delta(text, [5] * 8, [], True)).removeprefix("data: "))
    streamed = chunk["choices"][0]["delta"]["tool_calls"][0]["function"]
    assert streamed == call["function"] and chunk["choices"][0]["finish_reason"] == "length"
