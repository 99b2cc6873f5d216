"""The operator's router client (autoscaler signals, scale-down drain) against the router's real
HTTP handlers: a real Router facade behind serve_probes with the routes services/router/server.py
installs."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from baton.operators.autoscaler.signals import PoolRef, RouterStatsSource, router_signals
from baton.operators.drain import drain, drain_groups
from baton.services.common.http_probe import serve_probes
from baton.services.common.roles import Role
from baton.services.common.wire.router import load_report_from_proto
from baton.services.router.config import RouterConfig
from baton.services.router.router import Router
from baton.services.router.server import drain_json, stats_json
from baton.v1 import worker_pb2
from tests.router.helpers import Clock, report, stats

NOW = 1_000.0


@pytest.fixture
def router() -> Router:
    router = Router(RouterConfig(model="m"), CollectorRegistry(), Clock(NOW))
    for worker_id, role, load in (("qwen-prefill-a", Role.PREFILL, {"queued": 900, "kv_used": 200}),
                                  ("qwen-decode-a", Role.DECODE,
                                   {"running": 6, "waiting": 2, "kv_used": 500}),
                                  ("qwen-decode-b", Role.DECODE, {"running": 2, "kv_used": 300})):
        router.register_worker(worker_id, f"{worker_id}:8100", role, model="m", block_size=16)
        proto_role = worker_pb2.ROLE_PREFILL if role is Role.PREFILL else worker_pb2.ROLE_DECODE
        assert router.on_stats(report(worker_id, NOW, role=proto_role, **load))
    return router


@pytest.fixture
def url(router: Router) -> Iterator[str]:
    server = serve_probes("127.0.0.1", 0, CollectorRegistry(), lambda: True,
                          get_routes={"/stats": lambda: stats_json(router)},
                          post_routes={"/admin/drain": lambda body: drain_json(router, body)})
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def pool(url: str, role: str) -> PoolRef:
    return PoolRef("llm", f"qwen-{role}", "qwen", url, role)


@pytest.mark.asyncio
async def test_autoscaler_reads_the_routers_stats(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        source = RouterStatsSource(session)
        decode, prefill, mixed = [
            await source.fetch(pool(url, role)) for role in ("decode", "prefill", "mixed")
        ]
    assert (decode.kv_cache_usage, decode.running_requests, decode.waiting_requests) == (0.4, 10, 0)
    assert prefill.kv_cache_usage == 0.2
    assert mixed.running_requests == 0 and mixed.idle()


def test_behind_a_router_of_several_models_a_pool_reads_its_models_own_load() -> None:
    """A member's decode pool and its primary's share a router; each scales on its own workers."""
    router = Router(RouterConfig(model="m", additional_models=["coder"]), CollectorRegistry(),
                    Clock(NOW))
    for worker_id, model, running in (("qwen-decode-a", "m", 6), ("coder-decode-b", "coder", 1),
                                      ("coder-decode-a", "coder", 3)):
        router.register_worker(worker_id, f"{worker_id}:8100", Role.DECODE, model=model,
                               block_size=16)
        message = stats(worker_id, NOW, running=running, kv_used=100 * running)
        message.model = model
        assert router.on_stats(load_report_from_proto(message))
    got = stats_json(router)
    coder, qwen = router_signals(got, "decode", "coder"), router_signals(got, "decode", "m")
    assert (coder.running_requests, qwen.running_requests) == (4, 6)
    assert (coder.kv_cache_usage, qwen.kv_cache_usage) == (0.2, 0.6)
    # A router that reports no model of that name: the sum over its models.
    assert router_signals(got, "decode", "other").running_requests == 10


class PodKube:
    """The two calls drain makes: list the pool's pods, mark the victims."""

    def __init__(self, names: list[str]) -> None:
        self.pods = [{
            "metadata": {"name": n, "creationTimestamp": f"2024-01-0{i + 1}T00:00:00Z"},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        } for i, n in enumerate(names)]

    async def list(self, kind: str, namespace: str, selector: dict[str,
                                                                   str]) -> list[dict[str, Any]]:
        return self.pods

    async def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


@pytest.mark.asyncio
async def test_scale_down_drains_the_pods_worker_ids_at_the_router(router: Router,
                                                                   url: str) -> None:
    pool_body = {"metadata": {"namespace": "llm", "name": "qwen-decode"},
                 "spec": {"routerUrl": url, "drainTimeoutSeconds": 30}}
    async with aiohttp.ClientSession() as session:
        victims = await drain(PodKube(["qwen-decode-a", "qwen-decode-b"]), session, pool_body, {},
                              1, "/admin/drain")
    assert victims == ["qwen-decode-b"]  # the youngest
    workers = {w.worker_id: w for w in router._workers.values()}
    assert workers["qwen-decode-b"].draining and not workers["qwen-decode-a"].draining


@pytest.mark.asyncio
async def test_a_group_scale_down_drains_the_leaders_that_go() -> None:
    """A LeaderWorkerSet removes its highest groups; their leaders (the only workers the router
    knows of a group) are drained, and nothing the StatefulSet keeps."""
    router = Router(RouterConfig(model="m"), CollectorRegistry(), Clock(NOW))
    for group in range(3):
        leader = f"llama-decode-{group}"
        router.register_worker(leader, f"{leader}:8100", Role.DECODE, model="m", block_size=16)
    server = serve_probes("127.0.0.1", 0, CollectorRegistry(), lambda: True,
                          post_routes={"/admin/drain": lambda body: drain_json(router, body)})
    pool_body = {"metadata": {"namespace": "llm", "name": "llama-decode"},
                 "spec": {"replicas": 1,
                          "routerUrl": f"http://127.0.0.1:{server.server_address[1]}"}}
    try:
        async with aiohttp.ClientSession() as session:
            victims = await drain_groups(session, pool_body, 3, "/admin/drain")
    finally:
        server.shutdown()
    assert victims == ["llama-decode-2", "llama-decode-1"]
    draining = {w.worker_id: w.draining for w in router._workers.values()}
    assert draining == {"llama-decode-0": False, "llama-decode-1": True, "llama-decode-2": True}


def test_drain_answers_unknown_ids_and_refuses_bad_bodies(url: str) -> None:
    def post(body: bytes) -> tuple[int, Any]:
        request = urllib.request.Request(f"{url}/admin/drain", data=body, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    assert post(json.dumps({"worker_ids": ["gone"]}).encode()) == (200,
                                                                   {"unknown_worker_ids": ["gone"]})
    assert post(b'{"pods": ["x"]}')[0] == 400
    assert post(b"not json")[0] == 400
