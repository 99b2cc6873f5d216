"""`baton run-batch` end to end on a tiny model: good and bad lines in one file, results in input
order."""
from __future__ import annotations

import json

import jsonschema
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion
from transformers import AutoTokenizer

from baton.services.cli.main import main

MAX_LEN = 512
ENGINE_FLAGS = [
    "--dtype", "float32", "--device", "cpu", "--num-kv-blocks", "64", "--max-model-len",
    str(MAX_LEN)
]
PROMPT = "Once upon a time"
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a color."}]
GREEDY = {"temperature": 0, "ignore_eos": True, "return_token_ids": True}
SEEDED = {"custom_id": "seeded", "url": "/v1/completions",
          "body": {"prompt": PROMPT, "n": 2, "seed": 1234, "max_tokens": 8, "ignore_eos": True,
                   "return_token_ids": True}}
GOOD = [
    {
        "custom_id": "text", "url": "/v1/completions",
        "body": {"model": "any", "prompt": PROMPT, "max_tokens": 12, **GREEDY}
    },
    {
        "custom_id": "ids", "url": "/v1/completions",
        "body": {"prompt": [11, 42, 7, 99], "max_tokens": 4, **GREEDY}
    },
    {
        "custom_id": "chat", "url": "/v1/chat/completions",
        "body": {"messages": MESSAGES, "max_completion_tokens": 4, **GREEDY}
    },
    SEEDED,
    {
        "custom_id": "logprobs", "url": "/v1/completions",
        "body": {"prompt": PROMPT, "max_tokens": 5, "logprobs": 3, "ignore_eos": True}
    },
    {
        "custom_id": "chat-logprobs", "url": "/v1/chat/completions", "body": {
            "messages": MESSAGES, "max_tokens": 5, "logprobs": True, "top_logprobs": 2,
            "ignore_eos": True
        }
    },
]
# custom_id -> (raw line, the param its error names)
BAD = {
    "bad-url": ({"custom_id": "bad-url", "url": "/v1/embeddings", "body": {"input": "x"}}, "url"),
    "bad-body": ({
        "custom_id": "bad-body", "url": "/v1/completions",
        "body": {"prompt": "x", "temperature": "hot"}
    }, "temperature"),
    "tools": ({
        "custom_id": "tools", "url": "/v1/chat/completions",
        "body": {"messages": MESSAGES, "tools": [{"type": "function", "function": {}}]}
    }, "tools[0].function.name"),
    "too-long": ({
        "custom_id": "too-long", "url": "/v1/completions",
        "body": {"prompt": [5] * 10, "max_tokens": MAX_LEN}
    }, "max_tokens"),
    "stream":
        ({"custom_id": "stream", "url": "/v1/completions", "body": {"prompt": "x",
                                                                    "stream": True}}, "stream"),
}


def write_lines(path, items) -> None:
    path.write_text("".join(
        item if isinstance(item, str) else json.dumps({"method": "POST", **item}) + "\n"
        for item in items))


def run_batch(model_dir, tmp_path, items, name) -> list[dict]:
    src, dst = tmp_path / f"{name}.in.jsonl", tmp_path / f"{name}.out.jsonl"
    write_lines(src, items)
    assert main(
        ["run-batch", "-i",
         str(src), "-o",
         str(dst), "--model",
         str(model_dir), *ENGINE_FLAGS]) == 0
    return [json.loads(line) for line in dst.read_text().splitlines()]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def results(model_dir, tmp_path_factory):
    """One run holding every case, good lines interleaved with bad ones."""
    bad = [line for line, _ in BAD.values()]
    items = [
        GOOD[0], bad[0], "not json\n", GOOD[1], bad[1], GOOD[2], bad[2], GOOD[3], bad[3], GOOD[4],
        bad[4], {"url": "/v1/completions", "body": {"prompt": "x"}}, GOOD[5]
    ]
    lines = run_batch(model_dir, tmp_path_factory.mktemp("batch"), items, "main")
    expected_ids = [item.get("custom_id") if isinstance(item, dict) else None for item in items]
    assert [line["custom_id"] for line in lines] == expected_ids
    return {line["custom_id"]: line for line in lines}


def body(results, custom_id) -> dict:
    line = results[custom_id]
    assert line["response"]["status_code"] == 200 and line["error"] is None, line
    assert line["id"].startswith(
        "batch_req_") and line["response"]["request_id"] == line["response"]["body"]["id"]
    return line["response"]["body"]


def test_string_prompt(results, tokenizer):
    out = body(results, "text")
    choice = out["choices"][0]
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    Completion.model_validate(out)
    assert choice["prompt_token_ids"] == tokenizer.encode(PROMPT)
    assert len(choice["token_ids"]) == 12 and choice["finish_reason"] == "length"
    assert choice["text"] == tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert out["usage"] == {
        "prompt_tokens": len(choice["prompt_token_ids"]), "completion_tokens": 12,
        "total_tokens": len(choice["prompt_token_ids"]) + 12,
        "prompt_tokens_details": {"cached_tokens": 0}
    }


def test_token_id_prompt(results):
    choice = body(results, "ids")["choices"][0]
    assert choice["prompt_token_ids"] == [11, 42, 7, 99] and len(choice["token_ids"]) == 4


def test_chat(results, tokenizer):
    out = body(results, "chat")
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    ChatCompletion.model_validate(out)
    assert out["prompt_token_ids"] == tokenizer.encode(rendered, add_special_tokens=False)
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant" and len(choice["token_ids"]) == 4
    assert choice["message"]["content"] == tokenizer.decode(choice["token_ids"],
                                                            skip_special_tokens=True)


def test_bad_lines_get_their_own_errors(results):
    for custom_id, (_, param) in BAD.items():
        line = results[custom_id]
        assert line["response"]["status_code"] == 400, line
        error = line["response"]["body"]["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error" and error[
            "message"], error
    assert f"maximum context length is {MAX_LEN}" in results["too-long"]["response"]["body"][
        "error"]["message"]
    assert results[None]["response"]["status_code"] == 400  # the last line without a custom_id


def test_logprobs_shapes(results):
    lp = Completion.model_validate(body(results, "logprobs")).choices[0].logprobs.model_dump()
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(
        lp["text_offset"]) == 5
    # The top 3 plus the chosen token, keyed by text: byte tokens that all decode to U+FFFD share
    # one key.
    assert all(token in top and len(top) <= 4
               for token, top in zip(lp["tokens"], lp["top_logprobs"]))
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    chat = ChatCompletion.model_validate(body(results, "chat-logprobs"))
    content = chat.choices[0].logprobs.model_dump()["content"]
    assert len(content) == 5
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"} and len(
            entry["top_logprobs"]) == 2
        assert entry["logprob"] <= 0 and entry["top_logprobs"][0]["logprob"] >= entry[
            "top_logprobs"][1]["logprob"]


def stop_string(text: str) -> str:
    """Two characters from inside a text, found there first at their own position."""
    for i in range(2, len(text) - 2):
        candidate = text[i:i + 2]
        if "\ufffd" not in candidate and text.find(candidate) == i:
            return candidate
    raise AssertionError(f"no usable stop string in {text!r}")


def test_seeded_samples_reproduce_and_stop_strings_cut(results, model_dir, tmp_path):
    first = body(results, "seeded")["choices"]
    assert [c["index"] for c in first] == [0, 1] and all(len(c["token_ids"]) == 8 for c in first)
    assert first[0]["token_ids"] != first[1]["token_ids"]
    text = body(results, "text")["choices"][0]["text"]
    stop = stop_string(text)
    cut = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "stop": [stop]}
    again = run_batch(model_dir, tmp_path,
                      [{"custom_id": "stop", "url": "/v1/completions", "body": cut}, {
                          "custom_id": "stop-kept", "url": "/v1/completions",
                          "body": {**cut, "include_stop_str_in_output": True}
                      }, SEEDED], "again")
    assert [c["token_ids"]
            for c in again[2]["response"]["body"]["choices"]] == [c["token_ids"] for c in first]
    index = text.index(stop)
    for line, expected in zip(again[:2], (text[:index], text[:index + len(stop)])):
        choice = line["response"]["body"]["choices"][0]
        assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (expected,
                                                                                    "stop", stop)


def test_forced_tool_call_offline(model_dir, tmp_path):
    schema = {
        "type": "object", "properties": {
            "zone": {"enum": ["UTC", "CET"]},
            "hour": {"type": "integer", "minimum": 0, "maximum": 23}
        }, "required": ["zone", "hour"]
    }
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": schema}}]
    items = [{
        "custom_id": f"tool-{seed}", "url": "/v1/chat/completions", "body": {
            "messages": [{"role": "user", "content": "Time?"}], "tools": tools,
            "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 60, "seed": seed
        }
    } for seed in range(3)]
    for line in run_batch(model_dir, tmp_path, items, "tools"):
        choice = ChatCompletion.model_validate(body({line["custom_id"]: line},
                                                    line["custom_id"])).choices[0]
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
        call = choice.message.tool_calls[0].function
        assert call.name == "get_time"
        jsonschema.validate(json.loads(call.arguments), schema)
