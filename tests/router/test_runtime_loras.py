"""Runtime LoRA adapters as the router's desired state (services/router/runtime_loras.py): a request
for one is placed only on workers that have it, a worker that lacks it (joined later, or restarted
without it) is listed for its feed to load it, a confirmation outlives reports taken before it but
not one taken after, and a failed load waits before it is tried again."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from baton.services.common.messages.router import Placement, PlaceRequest
from baton.services.common.roles import Role
from baton.services.common.wire.router import load_report_from_proto
from baton.services.router.config import RouterConfig
from baton.services.router.rejections import RejectReason, Rejection
from baton.services.router.router import Router
from baton.services.router.runtime_loras import RETRY_FAILED_S, LoRALoad
from tests.router.helpers import Clock, stats

LOAD = LoRALoad("x", "/adapters/x")


def _router(clock: Clock, served: dict[str, list[str]]) -> Router:
    router = Router(RouterConfig(model="m", seed=0), CollectorRegistry(), clock=clock)
    for worker_id, adapters in served.items():
        router.register_worker(worker_id, f"{worker_id}:1", Role.MIXED)
        _report(router, clock, worker_id, adapters)
    return router


def _report(router: Router, clock: Clock, worker_id: str, adapters: list[str],
            taken_at: float | None = None) -> None:
    message = stats(worker_id, clock.now if taken_at is None else taken_at)
    message.lora_adapters.extend(adapters)
    assert router.on_stats(load_report_from_proto(message))


def _place(router: Router, i: int, lora_name: str | None) -> Placement | Rejection:
    outcome = router.place(PlaceRequest(f"r{lora_name}{i}", [i % 50 + 1] * 40, max_tokens=4,
                                        lora_name=lora_name))
    if isinstance(outcome, Placement):
        router.release(outcome.lease_id)
    return outcome


def _placed_on(router: Router, lora_name: str | None) -> str | RejectReason:
    outcome = _place(router, 0, lora_name)
    return outcome.decode_worker_id if isinstance(outcome, Placement) else outcome.reason


def test_runtime_adapter_goes_only_where_loaded_until_the_feed_loads_it() -> None:
    clock = Clock()
    router = _router(clock, {"w1": ["x"], "w2": []})
    router.drain(["w1"])  # from here on, w2 is the one place to go
    assert _placed_on(router, "x") == "w2", "before the runtime load it is not tracked"
    router.runtime_loras.set("m", "x", LOAD.path, ["w1"])
    assert _placed_on(router, "x") is RejectReason.NO_WORKERS
    assert _placed_on(router, None) == "w2"
    assert router.runtime_loras.to_load("w1") == []
    assert router.runtime_loras.to_load("w2") == [LOAD]
    router.runtime_loras.loaded("w2", LOAD, ok=True)
    assert router.runtime_loras.to_load("w2") == []
    assert _placed_on(router, "x") == "w2"
    # w2 restarts without it: its next report says so
    clock.advance(1.0)
    _report(router, clock, "w2", [])
    assert _placed_on(router, "x") is RejectReason.NO_WORKERS
    assert router.runtime_loras.to_load("w2") == [LOAD]


def test_a_confirmation_outlives_older_reports_only() -> None:
    clock = Clock()
    router = _router(clock, {"w1": []})
    clock.advance(0.5)
    router.runtime_loras.set(None, "x", LOAD.path, ["w1"])  # the gateway's fan-out reached it
    _report(router, clock, "w1", [], taken_at=clock.now - 0.2)  # taken before the load
    assert _placed_on(router, "x") == "w1"
    assert router.runtime_loras.to_load("w1") == []
    clock.advance(0.5)
    _report(router, clock, "w1", [])  # taken after: the worker lost it
    outcome = _place(router, 0, "x")
    assert isinstance(outcome, Rejection) and outcome.reason is RejectReason.NO_WORKERS
    assert "'x' loaded yet" in outcome.message and outcome.retry_after_s == 1.0
    assert router.runtime_loras.to_load("w1") == [LOAD]


def test_a_failed_load_is_retried_later_and_an_unload_stops_it() -> None:
    clock = Clock()
    router = _router(clock, {"w1": ["x"], "w2": []})
    router.drain(["w1"])
    router.runtime_loras.set("m", "x", LOAD.path, ["w1"])
    router.runtime_loras.loaded("w2", LOAD, ok=False)
    assert router.runtime_loras.to_load("w2") == []
    clock.advance(RETRY_FAILED_S)
    for worker_id, adapters in (("w1", ["x"]), ("w2", [])):
        router.heartbeat(worker_id)
        _report(router, clock, worker_id, adapters)
    assert router.runtime_loras.to_load("w2") == [LOAD]
    router.runtime_loras.set("m", "x", None)
    assert router.runtime_loras.to_load("w2") == []
    # no longer a runtime adapter: a worker that still has it answers for itself
    assert _placed_on(router, "x") == "w2"


def test_adapters_given_at_start_are_not_filtered_and_bad_updates_are_refused() -> None:
    clock = Clock()
    router = _router(clock, {"w1": ["start"], "w2": []})
    router.drain(["w1"])
    router.runtime_loras.set("m", "x", LOAD.path, ["w1", "gone"])
    assert _placed_on(router, "start") == "w2"
    with pytest.raises(KeyError):
        router.runtime_loras.set("other", "x", LOAD.path)
    with pytest.raises(ValueError):
        router.runtime_loras.set("m", "", LOAD.path)
    # a load of another folder than the wanted one does not confirm it
    router.runtime_loras.loaded("w2", LoRALoad("x", "/elsewhere"), ok=True)
    assert router.runtime_loras.to_load("w2") == [LOAD]


def test_a_reassertion_is_idempotent_and_the_stats_list_the_desired_set() -> None:
    """A gateway sends its record again whenever the router may have forgotten it: the same load
    twice (without the workers that confirmed it) changes nothing, nor does an unload twice."""
    clock = Clock()
    router = _router(clock, {"w1": ["x"], "w2": []})
    router.runtime_loras.set("m", "x", LOAD.path, ["w1"])
    before = (router.runtime_loras.to_load("w1"), router.runtime_loras.to_load("w2"))
    router.runtime_loras.set("m", "x", LOAD.path)
    assert (router.runtime_loras.to_load("w1"), router.runtime_loras.to_load("w2")) == before
    assert router.stats().served_models[0].runtime_loras == (("x", LOAD.path),)
    for _ in range(2):
        router.runtime_loras.set("m", "x", None)
        assert router.stats().served_models[0].runtime_loras == ()
