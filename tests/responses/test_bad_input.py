"""Bad input to the Responses API: OpenAI-shaped errors with the right status, never a 5xx; and a
store that is down answers 503 for what needs it while `store: false` requests are served."""
from __future__ import annotations

import httpx
import pytest

from baton.services.common.process import free_port
from baton.services.openai.responses import OUTPUT_LOGPROBS
from tests.responses.conftest import MODEL, client

ALPHA = {"Authorization": "Bearer sk-alpha"}
ITEM = {"role": "user", "content": "hi"}
# (body, status, param, words the message must contain)
BAD = [
    ({"model": MODEL, "input": "x", "previous_response_id": "resp_nope"}, 404,
     "previous_response_id", "resp_nope"),
    ({"model": MODEL, "input": [{"type": "reasoning", "summary": []}]}, 400, "input[0].type",
     "'reasoning'"),
    ({"model": MODEL, "input": [ITEM, {"type": "web_search_call", "id": "ws_1"}]}, 400,
     "input[1].type", "'web_search_call'"),
    ({"model": MODEL, "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://x/y.png"}]}]}, 400, "input[0].content",
     "input[0]"),
    ({"model": MODEL, "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, 400,
     "input[0].call_id", "call_id"),
    ({"model": MODEL, "input": [{"type": "function_call_output", "call_id": "c"}]}, 400,
     "input[0].output", "output"),
    ({"model": MODEL, "input": [{"role": "wizard", "content": "x"}]}, 400, "input[0].role",
     "role"),
    ({"model": MODEL, "input": ["just a string"]}, 400, "input[0]", "object"),
    ({"model": MODEL, "input": []}, 400, "input", "empty"),
    ({"model": MODEL, "input": 42}, 400, "input", "input"),
    ({"model": MODEL}, 400, "input", "input"),
    ({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type",
     "tools"),
    ({"model": MODEL, "input": "x", "tool_choice": "required"}, 400, "tool_choice", "tools"),
    ({"model": MODEL, "input": "x", "tools": [{"type": "function", "name": "f"}],
      "tool_choice": {"type": "function", "name": "g"}}, 400, "tool_choice", "`g`"),
    ({"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}},
     400, "text.format", "schema"),
    ({"model": MODEL, "input": "x", "max_output_tokens": 0}, 400, "max_output_tokens", ""),
    ({"model": MODEL, "input": "x", "max_output_tokens": 5000}, 400, "max_output_tokens",
     "context length"),
    ({"model": MODEL, "input": "x", "background": True, "store": False}, 400, "background",
     "store"),
    ({"model": MODEL, "input": "x", "frobnicate": 1}, 400, "frobnicate", "unknown"),
    ({"model": MODEL, "input": "x", "truncation": "auto"}, 400, "truncation", "not supported"),
    ({"model": "gpt-9", "input": "x"}, 404, "model", "gpt-9"),
    ({"model": MODEL, "input": "x", "include": ["file_search_call.results"]}, 400, "include[0]",
     "not supported"),
    ({"model": MODEL, "input": "x", "include": [OUTPUT_LOGPROBS, "bogus"]}, 400, "include[1]",
     "'bogus'"),
    ({"model": MODEL, "input": "x", "top_logprobs": 21}, 400, "top_logprobs", ""),
]


@pytest.mark.parametrize("body,status,param,words", BAD)
def test_bad_requests_are_refused_with_openai_errors(stack, body, status, param, words):
    answer = httpx.post(f"{stack.url}/responses", json=body, headers=ALPHA, timeout=60)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"]
    assert set(error) == {"message", "type", "param", "code"}


def test_unknown_ids_and_bad_paging(stack):
    assert httpx.get(f"{stack.url}/responses/resp_x", headers=ALPHA).status_code == 404
    assert httpx.delete(f"{stack.url}/responses/resp_x", headers=ALPHA).status_code == 404
    assert httpx.post(f"{stack.url}/responses/resp_x/cancel", headers=ALPHA).status_code == 404
    assert httpx.get(f"{stack.url}/responses", headers=ALPHA).status_code in (404, 405)
    created = client(stack.url).responses.create(model=MODEL, input="x", max_output_tokens=2)
    for query in ("limit=0", "limit=101", "limit=x", "order=up", "after=nope"):
        answer = httpx.get(f"{stack.url}/responses/{created.id}/input_items?{query}",
                           headers=ALPHA)
        assert answer.status_code == 400, query
    # only background responses can be cancelled
    answer = httpx.post(f"{stack.url}/responses/{created.id}/cancel", headers=ALPHA)
    assert answer.status_code == 400 and "background" in answer.json()["error"]["message"]
    assert httpx.post(f"{stack.url}/responses", json={"input": "x"}).status_code == 401


@pytest.fixture
def store_down(gateways) -> str:
    """A gateway whose PostgreSQL store listens nowhere."""
    return gateways.get("store-down", f"postgresql://postgres@127.0.0.1:{free_port()}/gone",
                        "--state-store-timeout-s=2")


def test_a_store_down_is_a_503_for_what_needs_it(store_down):
    api = client(store_down)
    served = api.responses.create(model=MODEL, input="x", max_output_tokens=2, store=False)
    assert served.status in ("completed", "incomplete")
    streamed = list(api.responses.create(model=MODEL, input="x", max_output_tokens=2,
                                         store=False, stream=True))
    assert streamed[-1].type in ("response.completed", "response.incomplete")
    for body in ({"input": "x"}, {"input": "x", "previous_response_id": "resp_1",
                                  "store": False},
                 {"input": "x", "background": True}, {"input": "x", "stream": True}):
        answer = httpx.post(f"{store_down}/responses", json=body, headers=ALPHA, timeout=60)
        assert answer.status_code == 503, body
        assert answer.json()["error"]["code"] == "state_store_unavailable"
    for path in ("resp_1", "resp_1/input_items"):
        assert httpx.get(f"{store_down}/responses/{path}", headers=ALPHA,
                         timeout=60).status_code == 503
    # the other endpoints do not need the store (their usage records are retried, and logged)
    chat = api.chat.completions.create(model=MODEL, max_tokens=2,
                                       messages=[{"role": "user", "content": "x"}])
    assert chat.choices[0].message is not None
