"""Gateway processes with their limits in the real Redis: two replicas hold one tenant's token
limit together; a stream the client leaves is settled to what it used; a request that fails
before the router answers is settled to its prompt; with Redis unreachable (a port nothing listens
on) one gateway fails open and another closed. A sim worker (20 ms a step) serves behind one
router. The gateways sharing Redis share one key prefix and one keys file, each
test its own tenant; the others serve the default tenant with a tokens-per-minute limit."""
from __future__ import annotations

import concurrent.futures
import signal
import time

import httpx
import openai
import pytest

from baton.services.common.process import ServiceProcess, free_port
from tests.launcher import (launch_gateway, launch_router, launch_sim_worker, scrape,
                            stop_all, wait_for)
from tests.redis_store import REDIS_URL, connect, drop, new_prefix, saved_level

LIMIT = 3000  # tokens per minute: 50 a second refill
PAIR_LIMIT = 1000
KEYS = f"""
tenants:
  - name: pair
    keys: ["sk-pair"]
    tokens_per_minute: {PAIR_LIMIT}
  - name: leaver
    keys: ["sk-leaver"]
    tokens_per_minute: {LIMIT}
"""


class Gateway:
    def __init__(self, service: ServiceProcess, port: int, metrics_port: int) -> None:
        self.service, self.port, self.metrics_port = service, port, metrics_port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def client(self, key: str = "unused") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url, api_key=key, max_retries=0, timeout=120)

    def metric(self, name: str, **labels: str) -> float:
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics", name, **labels)


def start_gateway(name: str, router: str, *extra: str) -> Gateway:
    metrics_port = free_port()
    service, port = launch_gateway(name, router, "--slos=", f"--metrics-port={metrics_port}",
                                   f"--default-tokens-per-minute={LIMIT}", *extra)
    return Gateway(service, port, metrics_port)


@pytest.fixture(scope="module")
def prefix():
    client = connect()  # fails, not skips, without Redis
    prefix = new_prefix()
    yield prefix
    drop(client, prefix)


@pytest.fixture(scope="module")
def gateways(prefix, tmp_path_factory):
    """Gateways started side by side (their start is the slow part): two sharing Redis, one whose
    router is not there, and two whose Redis is not there."""
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text(KEYS)
    started: list[ServiceProcess] = []
    try:
        worker, address = launch_sim_worker("worker", "--sim-step-base-seconds", "0.02")
        started.append(worker.wait_ready())
        router, _ = launch_router("router", "--workers", address)
        started.append(router.wait_ready())
        dead_redis = f"redis://127.0.0.1:{free_port()}/0"
        shared = [f"--rate-limit-store={REDIS_URL}", f"--rate-limit-key-prefix={prefix}"]
        made = {
            "a": start_gateway("gateway-a", router.address, *shared, f"--api-keys-file={keys}"),
            "b": start_gateway("gateway-b", router.address, *shared, f"--api-keys-file={keys}"),
            "no-router": start_gateway("gateway-n", f"127.0.0.1:{free_port()}", *shared),
            "open": start_gateway("gateway-open", router.address,
                                  f"--rate-limit-store={dead_redis}", "--rate-limit-fail=open"),
            "closed": start_gateway("gateway-closed", router.address,
                                    f"--rate-limit-store={dead_redis}",
                                    "--rate-limit-fail=closed"),
        }
        started += [g.service for g in made.values()]
        for gateway in made.values():
            # five start at once on a loaded machine: slow, but each well within this
            gateway.service.wait_ready(timeout=400)
        yield made
    finally:
        stop_all(list(reversed(started)))


def level(prefix: str, tenant: str) -> float | None:
    return saved_level(connect(), prefix, tenant, "tokens")


def complete(gateway: Gateway, max_tokens: int) -> int:
    """Tokens a completion of tenant `pair` used (prompt + output), 0 when refused with 429."""
    try:
        answer = gateway.client("sk-pair").completions.create(
            model="tiny-llama", prompt="count with me", max_tokens=max_tokens)
    except openai.RateLimitError:
        return 0
    return answer.usage.total_tokens


def test_two_gateways_hold_one_limit_together(gateways):
    """40 requests of about 105 tokens each, 4 at a time through each gateway: over 4x the limit
    asked for. Apart, the two would grant up to twice the limit; together they grant at most the
    limit, plus what refilled while the test ran, plus one request's reservation. The first 8
    fit the limit: both gateways serve some."""
    a, b = gateways["a"], gateways["b"]
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        used = list(pool.map(lambda i: complete(a if i % 2 else b, 100), range(40)))
    elapsed = time.monotonic() - started
    granted = [u for u in used if u]
    reservation = max(granted)
    assert sum(granted) <= PAIR_LIMIT + PAIR_LIMIT * elapsed / 60 + reservation, (used, elapsed)
    assert a.metric("baton_gateway_requests_total", status="200") > 0
    assert b.metric("baton_gateway_requests_total", status="200") > 0
    assert a.metric("baton_gateway_rate_limit_reserved_tokens") == 0
    assert b.metric("baton_gateway_rate_limit_reserved_tokens") == 0


def test_a_stream_the_client_leaves_is_settled_to_what_it_used(gateways, prefix):
    gateway = gateways["a"]
    body = {"model": "tiny-llama", "prompt": "count with me", "max_tokens": 2000,
            "stream": True}
    with httpx.stream("POST", f"{gateway.url}/completions", json=body, timeout=60,
                      headers={"Authorization": "Bearer sk-leaver"}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        # a few tokens, then the client goes away with ~2000 of its tokens still reserved
        for _ in range(3):
            next(line for line in lines if line.startswith("data: "))
        reserved = level(prefix, "leaver")
        assert reserved is not None and reserved < LIMIT - 2000
    # settled: the level written last gives back all but what was used (a few tokens, plus
    # however many the worker made before the gateway saw the client leave)
    wait_for(lambda: (level(prefix, "leaver") or 0) > LIMIT - 1000, timeout=30,
             what="the reservation given back")
    wait_for(lambda: gateway.metric("baton_gateway_rate_limit_reserved_tokens") == 0,
             timeout=30, what="no reservation left")


def test_a_request_failing_before_the_router_answers_is_settled(gateways, prefix):
    gateway = gateways["no-router"]
    with pytest.raises(openai.APIStatusError) as failed:
        gateway.client().completions.create(model="tiny-llama", prompt="count with me",
                                            max_tokens=2000)
    assert failed.value.status_code == 503
    # charged its prompt alone: the 2000 completion tokens it reserved are back
    wait_for(lambda: (level(prefix, "default") or 0) > LIMIT - 100, timeout=30,
             what="the reservation given back")
    assert gateway.metric("baton_gateway_rate_limit_reserved_tokens") == 0


def test_fail_open_serves_while_redis_is_unreachable(gateways):
    gateway = gateways["open"]
    for _ in range(3):
        answer = gateway.client().completions.create(model="tiny-llama", prompt="hi",
                                                     max_tokens=2)
        assert answer.usage.completion_tokens == 2
    assert gateway.metric("baton_gateway_rate_limit_store_errors_total",
                          decision="admitted") >= 1
    assert gateway.metric("baton_gateway_rate_limit_store_up") == 0
    assert_logged_once(gateway.service, "failing open")


def test_fail_closed_refuses_with_503_while_redis_is_unreachable(gateways):
    gateway = gateways["closed"]
    for _ in range(3):
        response = httpx.post(f"{gateway.url}/completions", timeout=60,
                              json={"model": "tiny-llama", "prompt": "hi", "max_tokens": 2})
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "rate_limit_store_unavailable"
        assert int(response.headers["Retry-After"]) >= 1
    assert gateway.metric("baton_gateway_rate_limit_store_errors_total", decision="refused") >= 1
    assert gateway.metric("baton_gateway_rejections_total",
                          reason="rate_limit_store_unavailable") == 3
    assert_logged_once(gateway.service, "failing closed")


def assert_logged_once(service: ServiceProcess, what: str) -> None:
    """The outage's line, once. Lines arrive through a reader thread: a line the gateway logs
    after the outage's (the SIGHUP answer) is awaited first, so that any repeat would have
    arrived too."""
    service.process.send_signal(signal.SIGHUP)
    wait_for(lambda: any("SIGHUP" in line for line in service.output), timeout=30,
             what="the SIGHUP answer logged")
    outages = [line for line in service.output if "rate-limit store" in line
               and "unavailable" in line]
    assert len(outages) == 1 and what in outages[0], outages
