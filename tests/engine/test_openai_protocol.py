"""OpenAI request parsing, conversion to engine inputs, refusals and response bodies (no model runs
here)."""
from __future__ import annotations

import math

import pytest
from transformers import AutoTokenizer

from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.openai.chat import ChatCompletionRequest
from baton.services.openai.completions import COMPLETION_DEFAULT_MAX_TOKENS, CompletionRequest
from baton.services.openai.endpoints import parse_request
from baton.services.openai.engine_input import to_engine_input
from baton.services.openai.errors import ProtocolError
from baton.services.openai.render import Choice, build_response

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
MAX_LEN = 64
USER = [{"role": "user", "content": "Name a color."}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dirs):
    return AutoTokenizer.from_pretrained(str(tiny_model_dirs["llama"]))


def convert(tokenizer, url, body, max_model_len=MAX_LEN):
    return to_engine_input(parse_request(url, body), tokenizer, max_model_len)


def refusal(url, body, tokenizer=None, strict=False) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        request = parse_request(url, body, strict)
        if tokenizer is not None:
            to_engine_input(request, tokenizer, MAX_LEN)
    assert info.value.status == 400
    return info.value


def test_completion_defaults(tokenizer):
    request = parse_request(COMPLETIONS, {"model": "m", "prompt": "Once upon a time"})
    assert isinstance(request, CompletionRequest)
    assert (request.n, request.stream, request.priority, request.return_token_ids) == (1, False, 0,
                                                                                       False)
    inp = to_engine_input(request, tokenizer, MAX_LEN)
    assert inp.prompts[0] == tokenizer.encode("Once upon a time")
    p = inp.params
    assert p.max_tokens == COMPLETION_DEFAULT_MAX_TOKENS == 16
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (1.0, 1.0, 0, 0.0, None)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.logprobs, p.stop, p.stop_token_ids, p.ignore_eos, p.min_tokens) == (None, [], [],
                                                                                  False, 0)
    assert p.skip_special_tokens and not p.include_stop_str_in_output


def test_chat_fills_the_context_by_default(tokenizer):
    inp = convert(tokenizer, CHAT, {"messages": USER})
    assert len(inp.prompts[0]) + inp.params.max_tokens == MAX_LEN
    assert convert(tokenizer, CHAT, {"messages": USER, "max_tokens": 5}).params.max_tokens == 5
    both = {"messages": USER, "max_tokens": 5, "max_completion_tokens": 7}
    assert convert(tokenizer, CHAT, both).params.max_tokens == 7


def test_fields_reach_sampling_params(tokenizer):
    body = {
        "prompt": [5, 6,
                   7], "max_tokens": 9, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1,
        "seed": 3, "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2,
        "stop": "\n", "stop_token_ids": [2], "n": 3, "logprobs": 2, "user": "u", "ignore_eos": True,
        "min_tokens": 1, "skip_special_tokens": False, "include_stop_str_in_output": True,
        "return_token_ids": True, "priority": 5, "cache_salt": "salt"
    }
    inp = convert(tokenizer, COMPLETIONS, body)
    p = inp.params
    assert inp.prompts[0] == [5, 6, 7] and inp.n == 3 and inp.cache_salt == "salt"
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (9, 0.5, 0.9, 40,
                                                                                0.1, 3)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.5, 1.2)
    assert (p.stop, p.stop_token_ids, p.logprobs, p.min_tokens) == (["\n"], [2], 2, 1)
    assert p.ignore_eos and p.include_stop_str_in_output and not p.skip_special_tokens
    # vLLM's priority runs lower first; the engine runs higher first.
    assert inp.priority == -5
    assert [p.for_choice(i).seed for i in range(3)] == [3, 4, 5]


def test_nulls_mean_defaults(tokenizer):
    inp = convert(
        tokenizer, COMPLETIONS,
        {"prompt": "x", "temperature": None, "stop": None, "best_of": None, "tools": None})
    assert inp.params.temperature == 1.0 and inp.params.stop == []


@pytest.mark.parametrize("prompt", [[7, 8], [[7, 8]], ["hello"]])
def test_single_prompt_forms(tokenizer, prompt):
    inp = convert(tokenizer, COMPLETIONS, {"prompt": prompt})
    assert inp.prompts[0] == ([7, 8] if prompt != ["hello"] else tokenizer.encode("hello"))


@pytest.mark.parametrize("url,extra,param", [
    (CHAT, {"functions": [{"name": "f"}]}, "functions"),
    (CHAT, {"structural_tag": "{}"}, "structural_tag"),
    (CHAT, {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    (COMPLETIONS, {"suffix": "end"}, "suffix"),
    (COMPLETIONS, {"best_of": 3}, "best_of"),
    (COMPLETIONS, {"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
])
def test_unsupported_fields_are_refused(url, extra, param):
    base = {"messages": USER} if url == CHAT else {"prompt": "x"}
    error = refusal(url, {**base, **extra})
    assert (error.param, error.code) == (param, "unsupported_parameter")
    assert f"`{param}`" in error.message


@pytest.mark.parametrize("extra", [{"best_of": 2, "n": 2}, {"echo": False}, {"logit_bias": {}},
                                   {"response_format": {"type": "text"}}, {"tool_choice": "none"}])
def test_harmless_values_of_unsupported_fields_pass(tokenizer, extra):
    assert convert(tokenizer, CHAT,
                   {"messages": USER, "max_tokens": 1, **extra}).params.max_tokens == 1


@pytest.mark.parametrize("url,body,param,fragment", [
    (CHAT, {"messages": [{"role": "", "content": "x"}]}, "messages[0].role", "at least 1"),
    (CHAT, {"messages": [{"role": "tool", "content": "x"}]}, "messages[0]", "tool_call_id"),
    (CHAT, {
        "messages": [{
            "role": "user", "content": "x", "tool_calls":
                [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
        }]
    }, "messages[0]", "only assistant"),
    (CHAT, {"messages": [{"role": "user", "content": None}]}, "messages[0]", "content is required"),
    (CHAT, {
        "messages":
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]
    }, "messages[0].content", "'image_url'"),
    (CHAT, {"messages": []}, "messages", "at least 1"),
    (COMPLETIONS, {"prompt": "x", "temperature": "hot"}, "temperature", "number"),
    (COMPLETIONS, {"prompt": {"text": "x"}}, "prompt", "token ids"),
    (COMPLETIONS, {"max_tokens": 3}, "prompt", "required"),
    (COMPLETIONS, {"prompt": "x", "n": 0}, "n", "greater than or equal to 1"),
    (COMPLETIONS, {"prompt": "x", "stream_options": {"include_usage": True}
                   }, "stream_options", "stream"),
    (CHAT, {"messages": USER, "top_logprobs": 2}, "top_logprobs", "logprobs"),
])
def test_bad_bodies_name_the_field(url, body, param, fragment):
    error = refusal(url, body)
    assert error.param == param and fragment in error.message, error.message


@pytest.mark.parametrize("url,body,param", [
    (COMPLETIONS, {"prompt": "x", "temperature": -1}, "temperature"),
    (COMPLETIONS, {"prompt": "x", "logprobs": 21}, "logprobs"),
    (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (CHAT, {"messages": USER, "max_completion_tokens": 0}, "max_completion_tokens"),
    (COMPLETIONS, {"prompt": "x", "min_tokens": 20}, "min_tokens"),
    (COMPLETIONS, {"prompt": ""}, "prompt"),
    # beyond the wire's int32 / uint32: a 400 here, not a failed gRPC call (a 500)
    (COMPLETIONS, {"prompt": "x", "top_k": 2**40}, "top_k"),
    (COMPLETIONS, {"prompt": "x", "stop_token_ids": [2**40]}, "stop_token_ids"),
])
def test_bad_values_name_the_field(tokenizer, url, body, param):
    error = refusal(url, body, tokenizer)
    assert error.param == param and error.message.startswith(param), error.message


def test_unknown_url_and_non_object_body():
    assert refusal("/v1/embeddings", {"input": "x"}).param == "url"
    assert refusal(COMPLETIONS, ["x"]).param == "body"


def test_a_body_too_deep_for_a_validator_is_a_400_not_a_recursion_error():
    schema: dict = {"type": "string"}
    for _ in range(400):  # jsonschema checks a tool's parameters recursively
        schema = {"type": "object", "properties": {"a": schema}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    error = refusal(CHAT, {"messages": USER, "tools": [tool]})
    assert error.code == "invalid_json" and "too deeply" in error.message


def test_context_length_errors_name_the_limit(tokenizer):
    too_long = refusal(COMPLETIONS, {"prompt": list(range(1, MAX_LEN + 1))}, tokenizer)
    assert too_long.param == "prompt" and too_long.code == "context_length_exceeded"
    assert f"maximum context length is {MAX_LEN} tokens" in too_long.message
    asks_too_much = refusal(COMPLETIONS, {"prompt": [1, 2, 3], "max_tokens": MAX_LEN}, tokenizer)
    assert asks_too_much.param == "max_tokens" and f"is {MAX_LEN} tokens" in asks_too_much.message
    assert f"{MAX_LEN + 3} tokens" in asks_too_much.message
    chat = refusal(CHAT, {"messages": [{"role": "user", "content": "word " * MAX_LEN}]}, tokenizer)
    assert chat.param == "messages" and chat.code == "context_length_exceeded"
    assert convert(tokenizer, COMPLETIONS,
                   {"prompt": [1, 2, 3], "max_tokens": MAX_LEN - 3}).params.max_tokens


def test_chat_is_rendered_through_the_template_once(tokenizer):
    messages = [{"role": "system", "content": "Be terse."}, {
        "role": "user", "content": [{"type": "text", "text": "Name"},
                                    {"type": "text", "text": "a color."}]
    }, {"role": "assistant", "content": "Red."}, {"role": "user", "content": "Another."}]
    inp = convert(tokenizer, CHAT, {"messages": messages, "max_tokens": 4}, max_model_len=256)
    expected = (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nName\na color.<|im_end|>\n"
        "<|im_start|>assistant\nRed.<|im_end|>\n<|im_start|>user\nAnother.<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert tokenizer.decode(inp.prompts[0]) == expected
    assert inp.prompts[0] == tokenizer.encode(expected, add_special_tokens=False)
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert inp.prompts[0][0] == start and inp.prompts[0].count(start) == 5


def test_parse_keeps_stream_options():
    request = parse_request(
        CHAT, {"messages": USER, "stream": True, "stream_options": {"include_usage": False}})
    assert isinstance(request, ChatCompletionRequest)
    assert request.stream and request.stream_options.include_usage is False


def _output(request_id, token_ids, logprobs=None, finish="length", stop=None) -> Choice:
    out = RequestOutput(request_id=request_id, prompt_token_ids=[1, 2, 3], token_ids=token_ids,
                        text="out", num_new_tokens=1, new_text="", finished=True,
                        finish_reason=finish, stop_reason=stop, logprobs=logprobs)
    return Choice.of(out)


def _logprobs(tokens):
    # The chosen token is ranked 3rd, so completions show it beside the top 2.
    return [
        TokenLogprobs(token_id=t, logprob=-2.5, rank=3, top={t + 1: -0.5, t + 2: -1.0})
        for t in tokens
    ]


def test_completion_response_shape(tokenizer):
    request = parse_request(COMPLETIONS,
                            {"prompt": [1, 2, 3], "n": 2, "logprobs": 2, "return_token_ids": True})
    outs = [
        _output("a", [300, 301], _logprobs([300, 301])),
        _output("b", [302], _logprobs([302]), "stop", "\n")
    ]
    body = build_response(request, outs, tokenizer, "tiny", "cmpl-1")
    assert (body["id"], body["object"], body["model"]) == ("cmpl-1", "text_completion", "tiny")
    assert isinstance(body["created"], int)
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    first, second = body["choices"]
    assert (first["index"], first["text"], first["finish_reason"],
            first["stop_reason"]) == (0, "out", "length", None)
    assert (second["index"], second["finish_reason"], second["stop_reason"]) == (1, "stop", "\n")
    assert first["token_ids"] == [300, 301] and first["prompt_token_ids"] == [1, 2, 3]
    lp = first["logprobs"]
    texts = [tokenizer.decode([t]) for t in (300, 301)]
    assert lp["tokens"] == texts and lp["token_logprobs"] == [-2.5, -2.5]
    assert lp["text_offset"] == [0, len(texts[0])]
    assert lp["top_logprobs"][0] == {
        tokenizer.decode([301]): -0.5,
        tokenizer.decode([302]): -1.0, texts[0]: -2.5
    }


def test_completion_response_without_extras(tokenizer):
    request = parse_request(COMPLETIONS, {"prompt": "x"})
    choice = build_response(request, [_output("a", [300])], tokenizer, "tiny")["choices"][0]
    assert choice[
        "logprobs"] is None and "token_ids" not in choice and "prompt_token_ids" not in choice


def test_chat_response_shape(tokenizer):
    request = parse_request(
        CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 2, "return_token_ids": True})
    lps = _logprobs([300])
    lps[0].logprob = -math.inf
    body = build_response(request, [_output("a", [300], lps)], tokenizer, "tiny")
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["prompt_token_ids"] == [1, 2, 3]
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "out"
                                 } and choice["token_ids"] == [300]
    entry = choice["logprobs"]["content"][0]
    token = tokenizer.decode([300])
    assert entry["token"] == token and entry["bytes"] == list(
        token.encode()) and entry["logprob"] == -9999.0
    assert [t["logprob"] for t in entry["top_logprobs"]] == [-0.5, -1.0]
    assert entry["top_logprobs"][0]["token"] == tokenizer.decode([301])


def test_error_body_is_openai_shaped():
    error = ProtocolError("bad", param="n", code="invalid_value")
    assert error.body() == {
        "error": {
            "message": "bad", "type": "invalid_request_error", "param": "n", "code": "invalid_value"
        }
    }


def test_scoring_fields_reach_sampling_params(tokenizer):
    inp = convert(tokenizer, COMPLETIONS, {"prompt": [5, 6], "logit_bias": {"5": 10, "7": -100.0},
                                           "prompt_logprobs": 2})
    assert (inp.params.logit_bias, inp.params.prompt_logprobs) == ({5: 10.0, 7: -100.0}, 2)
    echo = convert(tokenizer, COMPLETIONS,
                   {"prompt": [5, 6], "echo": True, "logprobs": 3, "max_tokens": 0})
    # max_tokens 0 runs one token (the prompt is scored on the way) and the answer drops it.
    assert (echo.params.prompt_logprobs, echo.params.logprobs, echo.params.max_tokens) == (3, 3, 1)
    assert convert(tokenizer, COMPLETIONS,
                   {"prompt": [5, 6], "echo": True}).params.prompt_logprobs is None


def test_echo_with_max_tokens_0_answers_the_prompt_alone(tokenizer):
    request = parse_request(COMPLETIONS,
                            {"prompt": [5, 6, 7], "echo": True, "logprobs": 1, "max_tokens": 0})
    scored = [None, TokenLogprobs(6, -1.5, 2, {9: -0.5}), TokenLogprobs(7, -2.5, 1, {7: -2.5})]
    out = RequestOutput("r", [5, 6, 7], [11], "x", 1, "x", True, "length",
                        logprobs=[TokenLogprobs(11, -0.1, 1)], prompt_logprobs=scored)
    choice = build_response(request, [Choice.of(out)], tokenizer, "m")["choices"][0]
    texts = [tokenizer.decode([t]) for t in (5, 6, 7)]
    assert choice["text"] == tokenizer.decode([5, 6, 7]) and choice["finish_reason"] == "length"
    assert choice["logprobs"] == {
        "tokens": texts, "token_logprobs": [None, -1.5, -2.5],
        "top_logprobs": [None, {tokenizer.decode([9]): -0.5, texts[1]: -1.5}, {texts[2]: -2.5}],
        "text_offset": [0, len(texts[0]), len(texts[0]) + len(texts[1])]}


@pytest.mark.parametrize("url,extra,param", [
    (COMPLETIONS, {"logit_bias": {"5": 101}}, "logit_bias"),
    (COMPLETIONS, {"logit_bias": {"x": 1}}, "logit_bias"),
    (COMPLETIONS, {"logit_bias": {"-1": 1}}, "logit_bias"),
    (COMPLETIONS, {"logit_bias": {"512": 1}}, "logit_bias"),
    (COMPLETIONS, {"max_tokens": 0}, "max_tokens"),
    (CHAT, {"prompt_logprobs": -1}, "prompt_logprobs"),
    (CHAT, {"prompt_logprobs": 21}, "prompt_logprobs"),
    (CHAT, {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    (COMPLETIONS, {"prompt_logprobs": 0, "stream": True}, "prompt_logprobs"),
])
def test_bad_scoring_fields_are_refused(tokenizer, url, extra, param):
    base = {"messages": USER} if url == CHAT else {"prompt": "x"}
    with pytest.raises(ProtocolError) as info:
        to_engine_input(parse_request(url, {**base, **extra}), tokenizer, MAX_LEN, vocab_size=512)
    assert (info.value.status, info.value.param) == (400, param)
