"""A grammar survives migration: constrained streams keep going on another decode worker after
theirs is killed (-9), each ending valid and exactly as an undisturbed run ends."""
from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest

from tests.launcher import start_stack

STREAMS = 8
# Long enough (about 100 tokens) that every stream is still going when the worker dies.
SCHEMA = {
    "type": "object", "properties": {
        "digits": {
            "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "minItems": 50, "maxItems": 50
        }
    }, "required": ["digits"], "additionalProperties": False
}


@pytest.fixture(scope="module")
def stack(model):
    # no latency SLOs: a refusal by predicted TPOT is not what this test looks at
    stack = start_stack(model, "disaggregated", decode_workers=2, gateway_args=["--slos="])
    yield stack
    stack.stop()


async def _stream(client: openai.AsyncOpenAI, model: str, i: int, progress: list[int]) -> str:
    stream = await client.completions.create(
        model=model, prompt=f"Record {i}:", max_tokens=200, temperature=0.7, seed=i, stream=True,
        extra_body={"guided_json": SCHEMA})
    text = ""
    async for chunk in stream:
        text += chunk.choices[0].text if chunk.choices else ""
        progress.append(1)
    return text


async def _run(url: str, model: str, kill=None) -> list[str]:
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    progress: list[int] = []
    tasks = [asyncio.ensure_future(_stream(client, model, i, progress)) for i in range(STREAMS)]
    if kill is not None:
        while len(progress) < STREAMS * 10:
            await asyncio.sleep(0.02)
        kill()
    return await asyncio.gather(*tasks)


def test_constrained_streams_survive_a_decode_worker_killed(stack, model):
    expected = asyncio.run(_run(stack.url, model.name))
    for text in expected:
        jsonschema.validate(json.loads(text), SCHEMA)
    got = asyncio.run(_run(stack.url, model.name, kill=lambda: stack.busiest_live_decode().kill()))
    assert got == expected
    assert stack.gateway_metric("baton_gateway_migrations_total") > 0
