"""Bad input gets the right HTTP status and an OpenAI-shaped error body; the gateway stays healthy
and every worker's KV blocks come back afterwards."""
from __future__ import annotations

import time

import httpx
import pytest

from tests.launcher import blocks_all_free

AUTH = {"Authorization": "Bearer sk-alpha"}
OK_COMPLETION = {"prompt": "hello", "max_tokens": 2}
OK_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

# (name, path, body (dict or raw bytes), headers, status, error code)
CASES = [
    ("malformed json", "/completions", b'{"prompt": "x",', AUTH, 400, "invalid_json"),
    ("json not an object", "/completions", b"[1, 2]", AUTH, 400, "invalid_value"),
    ("invalid utf-8", "/completions", b'{"prompt": "\xff\xfe"}', AUTH, 400, "invalid_encoding"),
    ("empty body", "/completions", b"", AUTH, 400, "invalid_json"),
    ("missing prompt", "/completions", {"max_tokens": 2}, AUTH, 400, "invalid_value"),
    ("prompt wrong type", "/completions", {"prompt": 5}, AUTH, 400, "invalid_value"),
    ("prompt list of mixed", "/completions", {"prompt": [1, "a"]}, AUTH, 400, "invalid_value"),
    ("empty prompt", "/completions", {"prompt": ""}, AUTH, 400, "invalid_value"),
    ("max_tokens string", "/completions", {**OK_COMPLETION, "max_tokens": "ten"}, AUTH, 400,
     "invalid_value"),
    ("max_tokens negative", "/completions", {**OK_COMPLETION, "max_tokens": -3}, AUTH, 400,
     "invalid_value"),
    ("max_tokens huge", "/completions", {**OK_COMPLETION, "max_tokens": 10**9}, AUTH, 400,
     "context_length_exceeded"),
    ("prompt past the context", "/completions", {"prompt": [5] * 5000, "max_tokens": 1}, AUTH, 400,
     "context_length_exceeded"),
    ("token id out of vocab", "/completions", {"prompt": [1, 10**7],
                                               "max_tokens": 1}, AUTH, 400, "invalid_value"),
    ("temperature negative", "/completions", {**OK_COMPLETION, "temperature": -1}, AUTH, 400,
     "invalid_value"),
    ("temperature huge", "/completions", {**OK_COMPLETION, "temperature": 1e9}, AUTH, 400,
     "invalid_value"),
    ("top_p zero", "/completions", {**OK_COMPLETION, "top_p": 0}, AUTH, 400, "invalid_value"),
    ("top_k below -1", "/completions", {**OK_COMPLETION, "top_k": -7}, AUTH, 400, "invalid_value"),
    ("n zero", "/completions", {**OK_COMPLETION, "n": 0}, AUTH, 400, "invalid_value"),
    ("logprobs too many", "/completions", {**OK_COMPLETION, "logprobs": 500}, AUTH, 400,
     "invalid_value"),
    ("presence_penalty out of range", "/completions", {**OK_COMPLETION, "presence_penalty": 9},
     AUTH, 400, "invalid_value"),
    ("seed too large", "/completions", {**OK_COMPLETION, "seed": 2**70}, AUTH, 400,
     "invalid_value"),
    ("stop wrong type", "/completions", {**OK_COMPLETION, "stop": 3}, AUTH, 400, "invalid_value"),
    ("known field asking for what is not served", "/completions", {**OK_COMPLETION, "suffix": "x"},
     AUTH, 400, "unsupported_parameter"),
    ("unknown model", "/completions", {**OK_COMPLETION, "model": "gpt-17"}, AUTH, 404,
     "model_not_found"),
    ("stream_options without stream", "/completions", {**OK_COMPLETION, "stream_options": {}}, AUTH,
     400, "invalid_value"),
    ("messages missing", "/chat/completions", {"max_tokens": 2}, AUTH, 400, "invalid_value"),
    ("messages empty", "/chat/completions", {"messages": []}, AUTH, 400, "invalid_value"),
    ("empty role", "/chat/completions", {"messages": [{"role": "", "content": "hi"}]}, AUTH,
     400, "invalid_value"),
    ("content wrong type", "/chat/completions", {"messages": [{"role": "user", "content": 7}]},
     AUTH, 400, "invalid_value"),
    ("image content part", "/chat/completions", {
        "messages": [{
            "role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]
        }]
    }, AUTH, 400, "invalid_value"),
    ("tool without a function", "/chat/completions", {**OK_CHAT, "tools": [{"type": "function"}]},
     AUTH, 400, "invalid_value"),
    ("tool without a name", "/chat/completions",
     {**OK_CHAT, "tools": [{"type": "function", "function": {}}]}, AUTH, 400, "invalid_value"),
    ("tool_choice unknown function", "/chat/completions", {
        **OK_CHAT, "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "nope"}}
    }, AUTH, 400, "invalid_value"),
    ("tool_choice required without tools", "/chat/completions",
     {**OK_CHAT, "tool_choice": "required"}, AUTH, 400, "invalid_value"),
    ("tool parameters not a schema", "/chat/completions", {
        **OK_CHAT, "tools": [{
            "type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}
        }]
    }, AUTH, 400, "invalid_value"),
    ("tool message without tool_call_id", "/chat/completions",
     {"messages": [*OK_CHAT["messages"], {"role": "tool",
                                          "content": "42"}]}, AUTH, 400, "invalid_value"),
    ("response_format bad schema", "/chat/completions", {
        **OK_CHAT, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}
        }
    }, AUTH, 400, "invalid_value"),
    ("response_format unknown type", "/chat/completions",
     {**OK_CHAT, "response_format": {"type": "yaml"}}, AUTH, 400, "invalid_value"),
    ("guided_regex unclosed", "/completions", {**OK_COMPLETION, "guided_regex": "a(b"}, AUTH, 400,
     "invalid_value"),
    ("two structured fields", "/completions",
     {**OK_COMPLETION, "guided_regex": "a", "guided_choice": ["b"]}, AUTH, 400, "invalid_value"),
    ("top_logprobs without logprobs", "/chat/completions", {**OK_CHAT, "top_logprobs": 2}, AUTH,
     400, "invalid_value"),
    ("missing key", "/completions", OK_COMPLETION, {}, 401, "invalid_api_key"),
    ("wrong key", "/completions", OK_COMPLETION, {"Authorization": "Bearer sk-nope"}, 401,
     "invalid_api_key"),
    ("not a bearer key", "/completions", OK_COMPLETION, {"Authorization": "Basic abc"}, 401,
     "invalid_api_key"),
    ("unknown route", "/embeddings", OK_COMPLETION, AUTH, 404, "not_found"),
]


@pytest.fixture(scope="module")
def http(disaggregated):
    with httpx.Client(base_url=disaggregated.url, timeout=30) as client:
        yield client


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_status_and_error_body(http, case):
    _, path, body, headers, status, code = case
    if isinstance(body, bytes):
        response = http.post(path, content=body,
                             headers={**headers, "Content-Type": "application/json"})
    else:
        response = http.post(path, json=body, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and set(error) == {
        "message", "type", "param", "code"
    }


def test_exhausted_rate_limit_gets_429_with_retry_after(http):
    limited = {"Authorization": "Bearer sk-limited"}
    statuses = [
        http.post("/completions", json=OK_COMPLETION, headers=limited).status_code for _ in range(3)
    ]
    assert statuses[:2] == [200, 200]
    last = http.post("/completions", json=OK_COMPLETION, headers=limited)
    assert last.status_code == 429 and int(last.headers["Retry-After"]) >= 1
    assert last.json()["error"]["code"] == "rate_limit_exceeded"


def test_still_healthy_and_blocks_back_after_the_abuse(http, disaggregated):
    assert http.get("/models", headers=AUTH).status_code == 200
    assert httpx.get(disaggregated.url.removesuffix("/v1") + "/health").status_code == 200
    assert http.post("/completions", json=OK_COMPLETION, headers=AUTH).status_code == 200
    deadline = time.monotonic() + 10
    while not blocks_all_free(disaggregated):
        assert time.monotonic() < deadline, "KV blocks did not return to baseline"
        time.sleep(0.1)
