"""Several base models behind one router: workers register with their model, a request is placed
only on workers of its model (an adapter's on its parent's), a model the router does not route is
refused as unknown (gRPC NOT_FOUND), and GetStats reports each model's own limit and adapters."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from baton.services.common.messages.router import Placement, PlaceRequest
from baton.services.common.roles import Role
from baton.services.common.wire.router import load_report_from_proto
from baton.services.router.config import RouterConfig
from baton.services.router.rejections import RejectReason, Rejection
from baton.services.router.router import Router
from baton.services.router.server import stats_json
from tests.router.helpers import Clock, stats

# two workers per model, so a placement could land on the other model's if it were not kept apart
WORKERS = {"a1": "alpha", "a2": "alpha", "b1": "beta", "b2": "beta"}


def _router(clock: Clock) -> Router:
    router = Router(RouterConfig(model="alpha", additional_models=["beta"], seed=3),
                    CollectorRegistry(), clock=clock)
    for worker_id, model in WORKERS.items():
        router.register_worker(worker_id, f"{worker_id}:1", Role.MIXED, model=model)
        message = stats(worker_id, clock())
        message.model, message.max_model_len = model, 256 if model == "alpha" else 64
        if model == "beta":
            message.lora_adapters.append("beta-coder")
        router.on_stats(load_report_from_proto(message))
    return router


def _place(router: Router, request_id: str, model: str | None,
           lora_name: str | None = None) -> Placement | Rejection:
    outcome = router.place(PlaceRequest(request_id, list(range(40)), max_tokens=8, model=model,
                                        lora_name=lora_name))
    assert isinstance(outcome, (Placement, Rejection))
    return outcome


def test_each_request_goes_only_to_its_models_workers() -> None:
    router = _router(Clock())
    for i in range(12):
        for model, prefix in ((None, "a"), ("alpha", "a"), ("beta", "b")):
            placed = _place(router, f"{model}-{i}", model)
            assert isinstance(placed, Placement) and placed.decode_worker_id.startswith(prefix)
        # an adapter runs on its parent's workers
        placed = _place(router, f"coder-{i}", "beta", lora_name="beta-coder")
        assert isinstance(placed, Placement) and placed.decode_worker_id.startswith("b")


def test_a_model_the_router_does_not_route_is_unknown() -> None:
    router = _router(Clock())
    refused = _place(router, "r", "gamma")
    assert isinstance(refused, Rejection) and refused.reason is RejectReason.UNKNOWN_MODEL
    assert RejectReason.UNKNOWN_MODEL.grpc_status == "NOT_FOUND"
    assert "'gamma'" in refused.message and "'beta'" in refused.message
    with pytest.raises(ValueError, match="serves 'gamma'"):
        router.register_worker("g1", "g1:1", Role.MIXED, model="gamma")


def test_a_model_whose_workers_are_gone_has_no_workers() -> None:
    router = _router(Clock())
    for worker_id in ("b1", "b2"):
        router.remove_worker(worker_id)
    refused = _place(router, "r", "beta")
    assert isinstance(refused, Rejection) and refused.reason is RejectReason.NO_WORKERS
    assert isinstance(_place(router, "r2", "alpha"), Placement)


def test_stats_report_each_models_limit_and_adapters() -> None:
    got = _router(Clock()).stats()
    alpha, beta = got.served_models
    assert (alpha.name, alpha.max_model_len, alpha.lora_adapters, alpha.workers) == (
        "alpha", 256, (), 2)
    assert (beta.name, beta.max_model_len, beta.lora_adapters, beta.workers) == (
        "beta", 64, ("beta-coder",), 2)
    # the top-level fields are the router's own --model's
    assert (got.model, got.max_model_len, got.lora_adapters) == ("alpha", 256, ())


def test_stats_json_has_each_models_own_pools() -> None:
    clock = Clock()
    router = _router(clock)
    router.remove_worker("b2")
    for worker_id, queued in (("a1", 100), ("a2", 20), ("b1", 3)):
        message = stats(worker_id, clock(), queued=queued)
        message.model = WORKERS[worker_id]
        router.on_stats(load_report_from_proto(message))
    got = stats_json(router)
    assert (got["pools"]["mixed"]["workers"], got["pools"]["mixed"]["queued_prefill_tokens"]) == (
        3, 123)
    own = {name: m["pools"]["mixed"] for name, m in got["models"].items()}
    assert {name: (p["workers"], p["queued_prefill_tokens"]) for name, p in own.items()} == {
        "alpha": (2, 120), "beta": (1, 3)}
