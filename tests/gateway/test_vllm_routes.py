"""vLLM's routes beside the OpenAI ones, against the whole stack in both modes: /v1/models/{id},
/tokenize and /detokenize (checked against the checkpoint's own tokenizer, and against what
/v1/chat/completions bills), /tokenizer_info, /version, /ping and SageMaker's /invocations (the
same answers as the routes it dispatches to); their refusals as OpenAI error JSON, which take a
key, and that /openapi.json documents each. /load is test_server_load.py's."""
from __future__ import annotations

import json
import uuid
from importlib.metadata import version

import httpx
import openai
import pytest
from transformers import AutoTokenizer

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
PROMPT = "Once upon a time there was"
ROUTES = ["/v1/models", "/v1/models/{model_id}", "/tokenize", "/detokenize", "/tokenizer_info",
          "/version", "/ping", "/load", "/invocations"]


@pytest.fixture(scope="module")
def tokenizer(model):
    return AutoTokenizer.from_pretrained(str(model))


@pytest.fixture
def http(stack, api_key):
    with httpx.Client(base_url=f"http://127.0.0.1:{stack.port}", timeout=60,
                      headers={"Authorization": f"Bearer {api_key}"}) as session:
        yield session


def test_models_carry_root_and_parent_and_each_has_its_own_url(client, model):
    [listed] = client.models.list().data
    card = client.models.retrieve(model.name)
    assert card.model_dump() == listed.model_dump()
    assert (card.id, card.root, card.parent) == (model.name, str(model), None)
    assert card.max_model_len > 0 and card.object == "model"
    with pytest.raises(openai.NotFoundError) as refused:
        client.models.retrieve("no-such-model")
    assert refused.value.code == "model_not_found" and "no-such-model" in refused.value.message


def test_tokenize_a_prompt_as_the_checkpoint_tokenizer_does(http, client, tokenizer):
    for special in (True, False):
        body = http.post("/tokenize", json={"prompt": PROMPT, "add_special_tokens": special,
                                            "return_token_strs": True}).json()
        expected = tokenizer.encode(PROMPT, add_special_tokens=special)
        assert body["tokens"] == expected and body["count"] == len(expected)
        assert body["token_strs"] == tokenizer.convert_ids_to_tokens(expected)
    assert body["max_model_len"] == client.models.list().data[0].max_model_len
    assert http.post("/tokenize", json={"prompt": PROMPT}).json()["token_strs"] is None


def test_tokenize_messages_renders_them_as_chat_does(http, client, model, tokenizer):
    for generation_prompt in (True, False):
        for tools in (None, TOOLS):
            body = {"messages": MESSAGES, "add_generation_prompt": generation_prompt}
            answer = http.post("/tokenize", json=body | ({"tools": TOOLS} if tools else {}))
            assert answer.status_code == 200, answer.text
            text = tokenizer.apply_chat_template(MESSAGES, tools=tools, tokenize=False,
                                                 add_generation_prompt=generation_prompt)
            assert answer.json()["tokens"] == tokenizer.encode(text, add_special_tokens=False)
    for generation_prompt in (True, False):
        flag = {"add_generation_prompt": generation_prompt}
        counted = http.post("/tokenize", json={"messages": MESSAGES, "tools": TOOLS, **flag})
        billed = client.chat.completions.create(model=model.name, messages=MESSAGES, tools=TOOLS,
                                                max_tokens=1, extra_body=flag)
        assert billed.usage.prompt_tokens == counted.json()["count"]


def test_detokenize_gives_back_the_text(http, model, tokenizer):
    tokens = http.post("/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    answer = http.post("/detokenize", json={"tokens": tokens, "model": model.name})
    assert answer.json() == {"prompt": PROMPT}
    chat = http.post("/tokenize", json={"messages": MESSAGES}).json()["tokens"]
    decoded = http.post("/detokenize", json={"tokens": chat}).json()["prompt"]
    assert decoded == tokenizer.decode(chat)
    assert http.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": MESSAGES}, 400, "messages"),
    ("/tokenize", {"prompt": 7}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "add_special_tokens": "sometimes"}, 400, "add_special_tokens"),
    ("/tokenize", {"prompt": "a", "temperature": 0.5}, 400, "temperature"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"messages": [{"role": "", "content": "hi"}]}, 400, "messages[0].role"),
    ("/tokenize", {"messages": MESSAGES, "chat_template": "{{ 1 }}"}, 400, "chat_template"),
    ("/tokenize", {"prompt": "a", "model": "other"}, 404, "model"),
    ("/tokenize", [PROMPT], 400, "body"),
    ("/detokenize", {"tokens": [1, 10 ** 9]}, 400, "tokens[1]"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
    ("/detokenize", {"tokens": ["hello"]}, 400, "tokens[0]"),
    ("/detokenize", {"tokens": [1.5]}, 400, "tokens[0]"),
    ("/detokenize", {}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "model": "other"}, 404, "model"),
    ("/invocations", {"input": "embed me"}, 400, "input"),
    ("/invocations", {"query": "q", "documents": ["d"]}, 400, "documents"),
    ("/invocations", {"max_tokens": 3}, 400, "body"),
    ("/invocations", {"prompt": PROMPT, "max_tokens": -1}, 400, "max_tokens"),
    ("/invocations", {"messages": MESSAGES, "model": "other"}, 404, "model"),
])
def test_bad_requests_get_openai_errors(http, path, body, status, param):
    answer = http.post(path, json=body)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and error["message"] and error["type"], error


@pytest.mark.parametrize("path, body, code", [
    ("/tokenize", {"prompt": "a", "temperature": 0.5}, "unknown_parameter"),
    ("/tokenize", {"messages": MESSAGES, "temperature": 0.5}, "unknown_parameter"),
    ("/detokenize", {"tokens": [1], "skip_special_tokens": True}, "unknown_parameter"),
    ("/tokenize", {"prompt": "a", "model": "other"}, "model_not_found"),
    ("/invocations", {"input": "embed me"}, "unsupported_request"),
])
def test_refusals_carry_their_codes(http, path, body, code):
    assert http.post(path, json=body).json()["error"]["code"] == code


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize", "/invocations"])
def test_a_body_that_is_not_json_is_refused(http, path):
    answer = http.post(path, content=b'{"prompt": ', headers={"Content-Type": "application/json"})
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_json"


def test_tokenizer_info_is_the_checkpoint_tokenizers_configuration(http, tokenizer):
    info = http.get("/tokenizer_info").json()
    assert info["tokenizer_class"] == type(tokenizer).__name__
    assert info["chat_template"] == tokenizer.chat_template
    assert info["eos_token"] == tokenizer.eos_token
    assert info["model_max_length"] == tokenizer.model_max_length
    assert not {"vocab_file", "merges_file", "tokenizer_file"} & set(info)


def test_version_and_ping(http):
    assert http.get("/version").json() == {"version": version("baton")}
    health = http.get("/health").json()
    assert http.get("/ping").json() == health == http.post("/ping").json()


def _greedy(body: dict) -> dict:
    # A salt of its own keeps each request off the other's cached prefix: both compute the whole
    # prompt alike, so greedy outputs agree token for token.
    return {"temperature": 0, "max_tokens": 6, "cache_salt": uuid.uuid4().hex, **body}


def _contents(answer: dict) -> list:
    return [c.get("message", {}).get("content", c.get("text")) for c in answer["choices"]]


def test_invocations_answers_as_the_route_it_dispatches_to(http, model):
    for route, body, kind in [
            ("/v1/chat/completions", {"messages": MESSAGES}, "chat.completion"),
            ("/v1/completions", {"prompt": PROMPT}, "text_completion")]:
        direct = http.post(route, json=_greedy(body))
        invoked = http.post("/invocations", json=_greedy(body | {"model": model.name}))
        assert invoked.status_code == direct.status_code == 200, invoked.text
        assert invoked.json()["object"] == kind
        assert _contents(invoked.json()) == _contents(direct.json())
        assert invoked.json()["usage"] == direct.json()["usage"]


def test_invocations_streams(http):
    events = []
    with http.stream("POST", "/invocations",
                     json=_greedy({"prompt": PROMPT, "stream": True})) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in answer.iter_lines() if line.startswith("data")]
    assert events[-1] == "[DONE]"
    streamed = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert streamed == _contents(http.post("/v1/completions", json=_greedy(
        {"prompt": PROMPT})).json())[0]


def test_openapi_documents_every_route(http):
    paths = http.get("/openapi.json").json()["paths"]
    assert set(ROUTES) <= set(paths)
    assert "post" in paths["/ping"] and "get" in paths["/ping"]
    for path in ("/tokenize", "/detokenize", "/invocations"):
        assert paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]


# (method, path, a body it serves)
KEYED = [("GET", "/v1/models", None), ("GET", "/v1/models/{model}", None),
         ("POST", "/tokenize", {"prompt": PROMPT}), ("POST", "/detokenize", {"tokens": [1, 2]}),
         ("GET", "/tokenizer_info", None), ("GET", "/load", None),
         ("POST", "/invocations", {"prompt": PROMPT, "max_tokens": 2})]


@pytest.mark.parametrize("method, path, body", KEYED)
def test_with_auth_on_the_model_routes_take_a_key(disaggregated, model, method, path, body):
    url = f"http://127.0.0.1:{disaggregated.port}{path.format(model=model.name)}"
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}):
        refused = httpx.request(method, url, json=body, headers=headers, timeout=60)
        assert refused.status_code == 401, refused.text
        assert refused.json()["error"]["code"] == "invalid_api_key"
    served = httpx.request(method, url, json=body, headers={"Authorization": "Bearer sk-alpha"},
                           timeout=60)
    assert served.status_code == 200, served.text


@pytest.mark.parametrize("method, path", [("GET", "/ping"), ("POST", "/ping"), ("GET", "/version")])
def test_probes_and_version_need_no_key(disaggregated, method, path):
    answer = httpx.request(method, f"http://127.0.0.1:{disaggregated.port}{path}", timeout=60)
    assert answer.status_code == 200, answer.text
