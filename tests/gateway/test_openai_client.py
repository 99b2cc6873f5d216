"""The official `openai` client, sync and async, against the whole stack in both modes."""
from __future__ import annotations

import asyncio
import json

import openai

from baton.services.cli.main import main

PROMPT = "Once upon a time there was"


def test_models_list(client, model):
    assert [m.id for m in client.models.list()] == [model.name]


def test_completion_and_stream_agree_with_usage(client, model):
    full = client.completions.create(model=model.name, prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(
        client.completions.create(model=model.name, prompt=PROMPT, max_tokens=12, temperature=0,
                                  stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert full.usage.prompt_tokens == chunks[-1].usage.prompt_tokens > 0
    assert full.choices[0].finish_reason in ("stop", "length")


def test_usage_reports_prompt_tokens_from_the_prefix_cache(client, model):
    prompt = list(range(100, 180))  # 80 tokens: five full blocks of 16
    kwargs = dict(model=model.name, prompt=prompt, max_tokens=2, temperature=0)
    client.completions.create(**kwargs)
    again = client.completions.create(**kwargs)
    streamed = list(
        client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    for usage in (again.usage, streamed[-1].usage):
        # Every full block but the last is reused; the last is recomputed so the prompt's last token
        # has logits.
        assert usage.prompt_tokens_details.cached_tokens == 64


def test_chat_streamed_and_not(client, model):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name a color."}]
    full = client.chat.completions.create(model=model.name, messages=messages, max_tokens=10,
                                          temperature=0)
    chunks = list(client.chat.completions.create(model=model.name, messages=messages, max_tokens=10,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_logprobs_stop_and_n(client, model):
    out = client.completions.create(model=model.name, prompt=PROMPT, max_tokens=8, temperature=0,
                                    logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == out.usage.completion_tokens
    # Keyed by token text, so tokens that render alike (byte fragments shown as U+FFFD) share one
    # entry.
    assert all(1 <= len(top) <= 4 for top in lp.top_logprobs)
    assert all(lp.token_logprobs[i] == top[lp.tokens[i]] for i, top in enumerate(lp.top_logprobs))
    full = out.choices[0].text
    if len(full) > 4:
        stop = full[2:4]
        cut = client.completions.create(model=model.name, prompt=PROMPT, max_tokens=8,
                                        temperature=0, stop=[stop])
        assert cut.choices[0].text == full[:full.index(stop
                                                       )] and cut.choices[0].finish_reason == "stop"
    chat = client.chat.completions.create(model=model.name,
                                          messages=[{"role": "user",
                                                     "content": "hi"}], max_tokens=6, n=3,
                                          temperature=1.0, seed=5, logprobs=True, top_logprobs=2)
    assert [c.index for c in chat.choices] == [0, 1, 2]
    # One logprob entry per generated token, across the n choices, each with its top 2.
    assert sum(len(c.logprobs.content) for c in chat.choices) == chat.usage.completion_tokens
    assert all(len(entry.top_logprobs) == 2 for c in chat.choices for entry in c.logprobs.content)


def test_seeded_sampling_reproduces(client, model):
    runs = [
        client.completions.create(model=model.name, prompt=PROMPT, max_tokens=16, temperature=1.0,
                                  seed=42, top_p=0.9, extra_body={"return_token_ids": True})
        for _ in range(2)
    ]
    assert runs[0].choices[0].model_extra["token_ids"] == runs[1].choices[0].model_extra[
        "token_ids"]


def test_async_client_streams_concurrently(stack, api_key, model):
    async def one(client: openai.AsyncOpenAI, i: int) -> str:
        stream = await client.completions.create(model=model.name, prompt=f"{PROMPT} {i}",
                                                 max_tokens=8, temperature=0, stream=True)
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=stack.url, api_key=api_key, max_retries=0)
        return await asyncio.gather(*(one(client, i) for i in range(6)))

    texts = asyncio.run(run())
    assert len(texts) == 6 and all(isinstance(t, str) for t in texts)


def test_greedy_text_matches_run_batch(client, model, tmp_path):
    prompts = [f"{PROMPT} {word}" for word in ("a king", "a cat", "the sea", "12345", "ünïcödé")]
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(
        json.dumps({
            "custom_id": str(i), "method": "POST", "url": "/v1/completions",
            "body": {"model": model.name, "prompt": p, "max_tokens": 20, "temperature": 0}
        }) + "\n" for i, p in enumerate(prompts)))
    assert main([
        "run-batch", "-i",
        str(src), "-o",
        str(dst), "--model",
        str(model), "--num-kv-blocks", "512"
    ]) == 0
    expected = [
        json.loads(line)["response"]["body"]["choices"][0]["text"]
        for line in dst.read_text().splitlines()
    ]
    got = [
        client.completions.create(model=model.name, prompt=p, max_tokens=20,
                                  temperature=0).choices[0].text for p in prompts
    ]
    assert got == expected
