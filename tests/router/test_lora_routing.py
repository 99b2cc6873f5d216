"""LoRA in the router: the lora_affinity scorer prefers a worker with the request's adapter
loaded, the router hashes a prompt under an adapter as the workers do (apart from the base
model's), and GetStats reports the adapters the live workers serve, through the wire."""
from __future__ import annotations

from prometheus_client import CollectorRegistry

from baton.services.common.block_hash import block_hashes
from baton.services.common.wire.router import (load_report_from_proto, router_stats_from_proto,
                                               router_stats_to_proto)
from baton.services.router.config import RouterConfig
from baton.services.router.plugins.base import SchedulingRequest
from baton.services.router.plugins.registry import scorer_class
from baton.services.router.plugins.scorers import LoRAAffinityScorer
from baton.services.router.router import Router
from baton.services.router.worker_state import CircuitBreaker, WorkerState
from baton.services.common.roles import Role
from tests.router.helpers import Clock, stats


def _worker(worker_id: str, served: list[str], loaded: list[str]) -> WorkerState:
    w = WorkerState(worker_id, f"{worker_id}:1", Role.DECODE, CircuitBreaker(3, 10.0))
    message = stats(worker_id, 1000.0)
    message.lora_adapters.extend(served)
    message.loaded_loras.extend(loaded)
    w.on_stats(load_report_from_proto(message))
    return w


def test_scorer_prefers_the_worker_with_the_adapter_loaded() -> None:
    scorer = LoRAAffinityScorer(1.0)
    loaded = _worker("a", ["x", "y"], ["x"])
    served = _worker("b", ["x", "y"], ["y"])
    other = _worker("c", ["y"], ["y"])
    request = SchedulingRequest("r", 32, 16, 1000.0, lora_name="x")
    assert [scorer.score(request, w) for w in (loaded, served, other)] == [1.0, 0.5, 0.0]
    base = SchedulingRequest("r", 32, 16, 1000.0)
    assert {scorer.score(base, w) for w in (loaded, served, other)} == {1.0}


def test_lora_affinity_is_a_default_scorer() -> None:
    assert "lora_affinity" in [s.name for s in RouterConfig().scorers]
    assert scorer_class("lora_affinity") is LoRAAffinityScorer


def test_hashes_are_salted_by_adapter() -> None:
    tokens = list(range(64))
    base = block_hashes(tokens, 16, "m", "salt")
    assert base == block_hashes(tokens, 16, "m", "salt", lora_name=None)
    a, b = (block_hashes(tokens, 16, "m", "salt", lora_name=n) for n in ("a", "b"))
    assert len({base[0], a[0], b[0]}) == 3
    assert a == block_hashes(tokens, 16, "m", "salt", lora_name="a")


def test_router_stats_name_the_served_adapters() -> None:
    router = Router(RouterConfig(model="m"), CollectorRegistry(), clock=Clock())
    for worker_id, served in (("w1", ["x", "y"]), ("w2", ["y", "z"])):
        message = stats(worker_id, 1000.0)
        message.lora_adapters.extend(served)
        router.register_worker(worker_id, f"{worker_id}:1", Role.DECODE)
        router.on_stats(load_report_from_proto(message))
    got = router_stats_from_proto(router_stats_to_proto(router.stats()))
    assert got.lora_adapters == ("x", "y", "z")
