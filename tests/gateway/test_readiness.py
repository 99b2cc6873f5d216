"""/ready follows the router: 503 with a reason while the router does not answer its health check,
200 once it does, 503 again when it goes. A request while the router is down gets a 503 that names
no internal address; the gateway's log has the details, with the request id."""
from __future__ import annotations

import re

import httpx
import openai
import pytest

from baton.services.common.process import free_port
from tests.launcher import launch_gateway, launch_router, wait_for


@pytest.fixture(scope="module")
def gateway():
    """A gateway whose router is not there (yet): its port is reserved, nothing listens."""
    router_port = free_port()
    service, port = launch_gateway("gateway", f"127.0.0.1:{router_port}",
                                   "--router-check-interval-s=0.2")
    service.wait_ready()
    yield service, port, router_port
    service.terminate()


def ready(port: int) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=10)


def unreachable(port: int) -> bool:
    answer = ready(port)
    return (answer.status_code == 503
            and answer.json()["error"]["message"] == "the router is unreachable")


def test_ready_follows_the_router(gateway):
    _, port, router_port = gateway
    wait_for(lambda: unreachable(port), what="not ready without a router")
    router, _ = launch_router("router", "--port", str(router_port))
    try:
        router.wait_ready()
        wait_for(lambda: ready(port).status_code == 200, timeout=20, what="ready with the router")
    finally:
        router.terminate()
    wait_for(lambda: unreachable(port), timeout=20, what="not ready once it left")


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_while_the_router_is_down_names_no_internal_address(gateway, stream):
    service, port, router_port = gateway
    # gone, not just draining (a draining router is not serving but still answers Place)
    wait_for(lambda: unreachable(port), what="router down")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    earlier = set(service.output)
    with pytest.raises(openai.APIStatusError) as refused:
        client.completions.create(model="tiny-llama", prompt="hello", max_tokens=2, stream=stream)
    error = refused.value
    assert error.status_code == 503
    message = error.body["message"] if isinstance(error.body, dict) else str(error.body)
    assert message == "no worker can serve this request now: the router is unreachable"
    assert "127.0.0.1" not in error.response.text and str(router_port) not in error.response.text
    # the details (the address, or how the connection broke) are in the log, with the request id
    # (the log reaches us through a reader thread, possibly after the answer did)
    pattern = re.compile(r"request cmpl-\w+-0: router call failed: UNAVAILABLE: ")
    wait_for(lambda: any(pattern.search(line) for line in list(service.output)
                         if line not in earlier),
             what="the failure logged with the request id")
