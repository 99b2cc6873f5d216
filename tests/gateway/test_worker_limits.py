"""A gateway started on its own, with nothing but the checkpoint, beside workers started with
--max-model-len 256 and --served-model-name: it learns both from the workers (through the router)
and answers as they would, in /v1/models and in OpenAI's context_length_exceeded error."""
from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from tests.launcher import launch_gateway, launch_router, launch_sim_worker, stop_all, wait_for

NAME = "served-as"


@pytest.fixture(scope="module")
def gateway_port():
    services = []
    try:
        worker, address = launch_sim_worker("sim-worker", "--max-model-len", "256",
                                            "--served-model-name", NAME)
        services.append(worker)
        router, _ = launch_router("router", "--workers", address, "--model", NAME)
        services.append(router)
        router.wait_ready()
        gateway, port = launch_gateway("gateway", router.address)
        services.insert(0, gateway)
        gateway.wait_ready()
        worker.wait_ready()
        yield port
    finally:
        stop_all(services)


def _models(port: int) -> list[dict]:
    url = f"http://127.0.0.1:{port}/v1/models"
    return json.loads(urllib.request.urlopen(url, timeout=10).read())["data"]


def test_models_and_long_prompts_follow_the_workers(gateway_port: int) -> None:
    # The gateway may have started before the worker reported; it learns within a check period.
    wait_for(lambda: _models(gateway_port)[0]["max_model_len"] == 256, timeout=20,
             what="the workers' max_model_len in /v1/models")
    assert [m["id"] for m in _models(gateway_port)] == [NAME]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway_port}/v1", api_key="none")
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=NAME, prompt="word " * 300, max_tokens=4)
    assert refused.value.code == "context_length_exceeded"
    assert "maximum context length is 256 tokens" in refused.value.message
    # Without max_tokens the answer may use what is left of the workers' 256, not of 2048.
    ok = client.completions.create(model=NAME, prompt="word " * 20, temperature=0)
    assert ok.usage.prompt_tokens + ok.usage.completion_tokens <= 256
