"""`baton serve --mode colocated -tp 2`: two mixed workers of two ranks each answer through the
official client exactly what the engine at TP=1 answers; kill -9 of one worker's second rank under
streaming load makes that worker exit at once with status 70 (no hang in a collective), every
stream finishes on the other worker with the same text, and the supervisor restarts the worker."""
from __future__ import annotations

import asyncio
import os
import signal
import time

import openai
import psutil
import pytest

from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.offline import run_requests
from tests.launcher import ServeCommand, wait_for

PROMPTS = [f"Story number {i}: once upon a time" for i in range(6)]
TOKENS = 24
EXIT_RANK_LOST = 70
# Four engine processes start on two cores: generous bounds for a loaded machine.
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    """The embedded model's greedy texts at TP=1, through the same OpenAI protocol code."""
    engine = LLMEngine(EngineConfig(dtype="float32", device="cpu", num_kv_blocks=512))
    bodies = [{"prompt": p, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
              for p in PROMPTS]
    results = run_requests(engine, [("/v1/completions", b) for b in bodies])
    return {p: r["choices"][0]["text"] for p, r in zip(PROMPTS, results)}


@pytest.fixture(scope="module")
def served():
    serve = ServeCommand("--mode", "colocated", "--decode-workers", "2", "-tp", "2",
                         "--dtype", "float32", "--restart-backoff-s", "0.5",
                         "--gateway-arg=--slos=", "--worker-arg=--num-kv-blocks=512",
                         "--router-arg=--circuit-cooldown-s=2")
    try:
        assert serve.ready.wait(600), "\n".join(serve.lines)
        yield serve
    finally:
        serve.stop()


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)


async def _stream(client: openai.AsyncOpenAI, prompt: str) -> str:
    stream = await client.completions.create(model="tiny-llama", prompt=prompt,
                                             max_tokens=TOKENS, temperature=0, stream=True,
                                             extra_body={"ignore_eos": True})
    return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])


async def _wave(url: str) -> list[str]:
    client = _client(url)
    return await asyncio.gather(*(_stream(client, p) for p in PROMPTS))


def _workers(serve: ServeCommand) -> list[psutil.Process]:
    return [c for c in psutil.Process(serve.process.pid).children()
            if "worker" in c.cmdline() and "mixed" in c.cmdline()]


def _rank(worker: psutil.Process) -> psutil.Process:
    [rank] = [c for c in worker.children() if "baton.services.engine.parallel.rank_worker" in
              c.cmdline()]
    return rank


def test_colocated_tp2_answers_as_tp1(served, expected):
    answers = asyncio.run(_wave(served.url))
    assert dict(zip(PROMPTS, answers)) == expected
    assert all(len(w.children()) >= 1 for w in _workers(served))


async def _kill_rank_under_load(url: str, rank: psutil.Process) -> list[tuple[str, str]]:
    """Waves of streams, the rank killed two seconds in, going on three seconds after."""
    client, answers, killed = _client(url), [], None
    started = time.monotonic()
    while killed is None or time.monotonic() - killed < 3:
        wave = asyncio.gather(*(_stream(client, p) for p in PROMPTS))
        if killed is None and time.monotonic() - started >= 2:
            await asyncio.sleep(0.2)  # the wave under way
            os.kill(rank.pid, signal.SIGKILL)
            killed = time.monotonic()
        answers += zip(PROMPTS, await wave)
    return answers


def test_a_rank_killed_takes_its_worker_down_and_streams_finish_elsewhere(served, expected):
    victim = _workers(served)[0]
    answers = asyncio.run(_kill_rank_under_load(served.url, _rank(victim)))
    assert answers and all(text == expected[prompt] for prompt, text in answers)
    wait_for(lambda: not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE,
             timeout=60, what="the worker whose rank died to exit")
    wait_for(lambda: any(f"exit code {EXIT_RANK_LOST}; restart 1" in line
                         for line in served.lines), timeout=60, what="the supervisor's line")
    wait_for(lambda: sum("is back at" in line for line in served.lines) >= 1, timeout=480,
             what="the worker restarted")
    wait_for(lambda: len(_workers(served)) == 2, timeout=60, what="two workers again")
    answers = asyncio.run(_wave(served.url))
    assert dict(zip(PROMPTS, answers)) == expected
    assert served.process.poll() is None
