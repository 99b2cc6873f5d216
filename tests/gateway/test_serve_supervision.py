"""`baton serve` supervises its children: kill -9 of one of two decode workers under load leaves the
stack answering every request (the official client, token for token), the worker restarted on its
address with one log line, and taking requests again. A child that keeps dying makes the supervisor
give up."""
from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
import time

import openai
import pytest

from baton.services.common.process import launch_command
from baton.services.common.supervisor import GaveUp, RestartPolicy, Supervisor
from tests.launcher import ServeCommand, scrape, wait_for

PROMPTS = [f"Story number {i}: once upon a time" for i in range(6)]
TOKENS = 40


@pytest.fixture(scope="module")
def served():
    serve = ServeCommand("--decode-workers", "2", "--restart-backoff-s", "0.5",
                         "--gateway-arg=--slos=", "--worker-arg=--num-kv-blocks=512",
                         "--router-arg=--circuit-cooldown-s=2")
    try:
        assert serve.ready.wait(240), "\n".join(serve.lines)
        yield serve
    finally:
        serve.stop()


async def _complete(client: openai.AsyncOpenAI, prompt: str) -> str:
    response = await client.completions.create(model="tiny-llama", prompt=prompt,
                                               max_tokens=TOKENS, temperature=0,
                                               extra_body={"ignore_eos": True})
    return response.choices[0].text


def _client(url: str) -> openai.AsyncOpenAI:
    # one per event loop: its connections belong to the loop that opened them
    return openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


async def _wave(url: str) -> list[str]:
    client = _client(url)
    return await asyncio.gather(*(_complete(client, p) for p in PROMPTS))


async def _kill_under_load(url: str, victim: int) -> list[tuple[str, str]]:
    """Waves of one request per prompt, the victim killed during one after two seconds, going on
    for three seconds after (the worker down, then coming back); every (prompt, text) answered."""
    client, answers, killed = _client(url), [], None
    started = time.monotonic()
    while killed is None or time.monotonic() - killed < 3:
        wave = asyncio.gather(*(_complete(client, p) for p in PROMPTS))
        if killed is None and time.monotonic() - started >= 2:
            await asyncio.sleep(0.2)  # the wave under way
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
        answers += zip(PROMPTS, await wave)
    return answers


def test_a_decode_worker_killed_under_load_is_restarted_and_serves_again(served):
    expected = dict(zip(PROMPTS, asyncio.run(_wave(served.url))))
    before = served.decode_workers()
    victim = next(iter(before))
    answers = asyncio.run(_kill_under_load(served.url, victim))
    assert answers and all(text == expected[prompt] for prompt, text in answers)
    wait_for(lambda: any("is back at" in line for line in served.lines), timeout=120,
             what="the worker restarted")
    restarts = [line for line in served.lines if "killed by SIGKILL; restart 1 in 0.5s" in line]
    assert len(restarts) == 1, served.lines
    name = re.search(r"(decode-worker-\d+) killed", restarts[0]).group(1)
    assert any(f"{name} is back at" in line for line in served.lines)
    after = served.decode_workers()
    [new] = set(after) - set(before)
    assert len(after) == 2 and victim not in after
    # Its circuit closes again (after a 2 s cooldown, one probe): later requests land on it.
    metrics = f"http://127.0.0.1:{after[new]}/metrics"

    def served_by_new() -> bool:
        asyncio.run(_wave(served.url))
        return scrape(metrics, "baton_request_success_total") > 0

    wait_for(served_by_new, timeout=60, what="a request on the restarted worker")
    assert served.process.poll() is None


def test_a_child_that_keeps_dying_makes_the_supervisor_give_up(caplog):
    crasher = launch_command("crasher", [sys.executable, "-c", "print('boom'); exit(3)"])
    supervisor = Supervisor([crasher], RestartPolicy(max_restarts=2, window_s=60, backoff_s=0.1))
    caplog.set_level(logging.INFO, logger="baton.services.common.supervisor")
    started = time.monotonic()
    with pytest.raises(GaveUp, match="crasher died 3 times within 60s \\(last: exit code 3\\)"):
        while time.monotonic() - started < 60:
            supervisor.check()
            time.sleep(0.02)
    deaths = [r.getMessage() for r in caplog.records]
    assert deaths[0].startswith("crasher exit code 3; restart 1 in 0.1s; its last lines:\nboom")
    assert deaths[1].startswith("crasher exit code 3; restart 2 in 0.2s")
    assert len(deaths) == 3 and crasher.process.poll() == 3
