"""GET /load answers vLLM's {"server_load": requests in flight}: it rises with each stream the
gateway serves and falls back as each one's client leaves. A sim worker taking 50 ms a step keeps
a stream of 2,000 tokens running for over a minute and a half, far longer than the polls need; each
stream is closed by its client as soon as its count is seen."""
from __future__ import annotations

import httpx
import openai
import pytest

from tests.launcher import gateway_on, wait_for


@pytest.fixture(scope="module")
def port(sim_router):
    with gateway_on(sim_router, "--slos=") as port:
        yield port


def load(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/load", timeout=30).json()["server_load"]


def test_load_counts_the_requests_in_flight(port):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    wait_for(lambda: load(port) == 0, timeout=30, what="an idle gateway's load of 0")
    streams = []
    for expected in (1, 2):
        stream = client.completions.create(model="tiny-llama", prompt="Once upon a time",
                                           max_tokens=2000, stream=True,
                                           extra_body={"ignore_eos": True})
        next(iter(stream))  # started: the gateway counts it from placement to its end
        streams.append(stream)
        wait_for(lambda: load(port) == expected, timeout=30, what=f"a load of {expected}")
    for expected in (1, 0):
        streams.pop().close()
        wait_for(lambda: load(port) == expected, timeout=30, what=f"a load of {expected}")
