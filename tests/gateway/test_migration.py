"""Request migration: a decode worker killed (-9) while 16 greedy streams are mid-flight. With
migration on, every stream completes with exactly the text of an undisturbed run; with it off, each
stream that was on the dead worker ends with an error event and the others complete. A grammar
survives migration too: constrained streams keep going on another decode worker after theirs is
killed, each ending valid and exactly as an undisturbed run ends.

One stack serves the module (starting one takes seconds): four decode workers, as the tests kill
three of them, one at a time."""
from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest

from tests.launcher import Stack, launch_gateway, scrape, start_stack, wait_for

STREAMS = 16
TOKENS = 120
PROMPTS = [f"Story number {i}: once upon a time" for i in range(STREAMS)]
CONSTRAINED_STREAMS = 8
# Long enough (about 100 tokens) that every stream is still going when the worker dies.
SCHEMA = {
    "type": "object", "properties": {
        "digits": {
            "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "minItems": 50, "maxItems": 50
        }
    }, "required": ["digits"], "additionalProperties": False
}


# No latency SLOs: the router would refuse some of the 16 streams by predicted TPOT once the first
# phase taught it the decode step time, and a refusal is not what these tests look at.
NO_SLOS = "--slos="


@pytest.fixture(scope="module")
def stack(model):
    stack = start_stack(model, "disaggregated", decode_workers=4, gateway_args=[NO_SLOS])
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def no_migration_url(stack, model):
    gateway, port = launch_gateway("gateway-no-migration", stack.router.address,
                                   "--model", str(model), "--max-migrations", "0", NO_SLOS)
    gateway.wait_ready()
    yield f"http://127.0.0.1:{port}/v1"
    gateway.terminate()


async def _stream(client: openai.AsyncOpenAI, model: str, prompt: str,
                  progress: list[int]) -> str | Exception:
    text = ""
    try:
        stream = await client.completions.create(model=model, prompt=prompt, max_tokens=TOKENS,
                                                 temperature=0, stream=True,
                                                 extra_body={"ignore_eos": True})
        async for chunk in stream:
            text += chunk.choices[0].text if chunk.choices else ""
            progress.append(1)
    except openai.APIError as e:
        return e
    return text


async def _run_and_kill(url: str, model: str, stack,
                        victim_filter) -> tuple[list[str | Exception], str]:
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    progress: list[int] = []
    tasks = [asyncio.ensure_future(_stream(client, model, p, progress)) for p in PROMPTS]
    while len(progress) < STREAMS * 4:  # every stream well under way
        await asyncio.sleep(0.02)
    victim = victim_filter(stack)
    victim.kill()
    return await asyncio.gather(*tasks), victim.name


async def _undisturbed(url: str, model: str) -> list[str]:
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    return await asyncio.gather(*(_stream(client, model, p, []) for p in PROMPTS))


def test_streams_survive_a_decode_worker_killed_mid_flight(stack, model, no_migration_url):
    expected = asyncio.run(_undisturbed(stack.url, model.name))
    assert all(isinstance(t, str) and t for t in expected)

    # Migration off: streams on the dead worker end with an error event, the rest are untouched.
    off, _ = asyncio.run(_run_and_kill(no_migration_url, model.name, stack,
                                       Stack.busiest_live_decode))
    failed = [i for i, r in enumerate(off) if isinstance(r, Exception)]
    assert 0 < len(failed) < STREAMS
    assert all("could not move" in str(off[i]) for i in failed), [str(off[i]) for i in failed]
    # the worker's address (in the gRPC details) stays in the gateway's log
    assert not any("127.0.0.1" in str(off[i]) for i in failed), [str(off[i]) for i in failed]
    assert all(off[i] == expected[i] for i in range(STREAMS) if i not in failed)

    # Migration on: the same load, another worker killed, and every stream is whole and identical.
    on, victim = asyncio.run(_run_and_kill(stack.url, model.name, stack, Stack.busiest_live_decode))
    assert on == expected, victim
    assert stack.gateway_metric("baton_gateway_migrations_total") > 0

    # every request settled its rate-limit reservation once: the failed, the migrated, the rest
    reserved = "baton_gateway_rate_limit_reserved_tokens"
    no_migration_metrics = no_migration_url.removesuffix("/v1") + "/metrics"
    wait_for(lambda: stack.gateway_metric(reserved) == 0 and
             scrape(no_migration_metrics, reserved) == 0, timeout=30,
             what="no reservation left")


async def _constrained(client: openai.AsyncOpenAI, model: str, i: int, progress: list[int]) -> str:
    stream = await client.completions.create(
        model=model, prompt=f"Record {i}:", max_tokens=200, temperature=0.7, seed=i, stream=True,
        extra_body={"guided_json": SCHEMA})
    text = ""
    async for chunk in stream:
        text += chunk.choices[0].text if chunk.choices else ""
        progress.append(1)
    return text


async def _run_constrained(url: str, model: str, kill=None) -> list[str]:
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0)
    progress: list[int] = []
    tasks = [asyncio.ensure_future(_constrained(client, model, i, progress))
             for i in range(CONSTRAINED_STREAMS)]
    if kill is not None:
        while len(progress) < CONSTRAINED_STREAMS * 10:
            await asyncio.sleep(0.02)
        kill()
    return await asyncio.gather(*tasks)


def test_constrained_streams_survive_a_decode_worker_killed(stack, model):
    expected = asyncio.run(_run_constrained(stack.url, model.name))
    for text in expected:
        jsonschema.validate(json.loads(text), SCHEMA)
    migrations = stack.gateway_metric("baton_gateway_migrations_total")
    got = asyncio.run(_run_constrained(stack.url, model.name,
                                       kill=lambda: stack.busiest_live_decode().kill()))
    assert got == expected
    assert stack.gateway_metric("baton_gateway_migrations_total") > migrations
