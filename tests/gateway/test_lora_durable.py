"""Runtime LoRA adapters outlive a router restart (services/gateway/lora_reconcile.py): two
gateways on one PostgreSQL store (the session's own database) over a router and simulated
workers. After the router is killed (-9) and started again on its port, the adapters loaded
through either gateway are re-asserted and an unloaded one stays unloaded; a worker that starts
after the restart is given the adapter and serves requests for it. A gateway whose store does not
answer refuses loads and unloads with a 503 and changes nothing."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest

from baton.services.checkpoints.tiny_lora import make_tiny_lora
from baton.services.checkpoints.tiny_model import embedded_model_path
from baton.services.common.process import ServiceProcess, free_port
from baton.v1 import router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.launcher import (launch_gateway, launch_router, launch_sim_worker, scrape, stop_all,
                            wait_for)
from tests.responses.conftest import fresh_database

KEYS = """
tenants:
  - name: ops
    keys: ["sk-ops"]
    admin: true
"""
ADMIN = {"Authorization": "Bearer sk-ops"}
SIM_LORA = ("--enable-lora", "--max-loras=4", "--sim-step-base-seconds=0.01")
RESTART_S = 120.0  # a restart's every step is polled for up to this long


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_lora(embedded_model_path(), tmp_path_factory.mktemp("durable") / "qv8", 8,
                          ("q_proj", "v_proj"), seed=1)


@pytest.fixture(scope="module")
def pg_store() -> Iterator[str]:
    with fresh_database("baton_lora") as url:
        yield url


class Fleet:
    """A simulated worker, a router over it, and gateways: `a` and `b` on the shared store, `down`
    on a PostgreSQL port where nothing listens."""

    def __init__(self, store: str, keys: Path) -> None:
        self.worker, address = launch_sim_worker("sim-worker-1", *SIM_LORA)
        self.router, _ = launch_router("router", "--workers", address)
        self.services: list[ServiceProcess] = [self.worker, self.router]
        self.gateways: dict[str, ServiceProcess] = {}
        self.ports: dict[str, int] = {}
        # a: only the router's stats wake its re-assertion; b: the shared record is read often
        for name, url, extra in (
                ("a", store, "--lora-reconcile-interval-s=3600"),
                ("b", store, "--lora-reconcile-interval-s=1"),
                ("down", f"postgresql://postgres@127.0.0.1:{free_port()}/none",
                 "--state-store-timeout-s=2")):
            self.gateways[name], self.ports[name] = launch_gateway(
                f"gateway-{name}", f"127.0.0.1:{self.router_port()}", f"--api-keys-file={keys}",
                f"--state-store={url}", "--allow-runtime-lora-updating", "--slos=",
                "--router-check-interval-s=0.5", extra)
            self.services.insert(0, self.gateways[name])
        for service in self.services:
            service.wait_ready()

    def router_port(self) -> int:
        return int(self.router.command[self.router.command.index("--port") + 1])

    def post(self, gateway: str, path: str, body: dict) -> httpx.Response:
        return httpx.post(f"http://127.0.0.1:{self.ports[gateway]}/v1/{path}_lora_adapter",
                          json=body, headers=ADMIN, timeout=120)

    def client(self, gateway: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.ports[gateway]}/v1",
                             api_key="sk-ops", max_retries=0, timeout=120)

    def wanted(self) -> set[str]:
        """The router's desired set of runtime adapters (GetStats)."""
        with grpc.insecure_channel(self.router.address) as channel:
            stats = router_pb2_grpc.RouterStub(channel).GetStats(
                router_pb2.GetRouterStatsRequest(), timeout=30)
        return {lora.name for m in stats.served_models for lora in m.runtime_loras}

    def restart_router(self) -> None:
        self.router.kill()
        self.router.relaunch()
        self.router.wait_ready()


@pytest.fixture(scope="module")
def fleet(pg_store: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    keys = tmp_path_factory.mktemp("durable-keys") / "keys.yaml"
    keys.write_text(KEYS)
    fleet = Fleet(pg_store, keys)
    yield fleet
    stop_all([s for s in fleet.services if s.process.poll() is None])


def _served(address: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        stats = worker_pb2_grpc.WorkerStub(channel).GetStats(worker_pb2.GetStatsRequest(),
                                                             timeout=30)
    return set(stats.lora_adapters)


def _answers(client: openai.OpenAI, model: str) -> bool:
    try:
        client.completions.create(model=model, prompt="Hello", max_tokens=4)
    except (openai.NotFoundError, openai.InternalServerError):  # not known, or not placed, yet
        return False
    return True


def _drain_all_but(fleet: Fleet, address: str) -> None:
    """Drains every worker but the one at `address`, once the router lists both."""
    with grpc.insecure_channel(fleet.router.address) as channel:
        router = router_pb2_grpc.RouterStub(channel)

        def listed() -> list[router_pb2.WorkerEndpoint]:
            return list(router.ListWorkers(router_pb2.ListWorkersRequest(), timeout=30).workers)

        wait_for(lambda: len(listed()) == 2, timeout=RESTART_S, what="the router lists both")
        router.Drain(router_pb2.DrainRequest(
            worker_ids=[w.worker_id for w in listed() if w.address != address]), timeout=30)


def _load(fleet: Fleet, gateway: str, name: str, adapter: Path) -> None:
    loaded = fleet.post(gateway, "load", {"lora_name": name, "lora_path": str(adapter)})
    assert loaded.status_code == 200, loaded.text


def test_a_store_that_is_down_refuses_updates_and_changes_nothing(fleet, adapter) -> None:
    refused = fleet.post("down", "load", {"lora_name": "nowhere", "lora_path": str(adapter)})
    assert refused.status_code == 503, refused.text
    error = refused.json()["error"]
    assert error["code"] == "state_store_unavailable" and error["type"] == "server_error"
    assert "nowhere" not in _served(fleet.worker.address)
    assert "nowhere" not in fleet.wanted()
    assert any("request lora-" in line and "refused: state store" in line
               for line in fleet.gateways["down"].output)
    _load(fleet, "a", "kept", adapter)
    refused = fleet.post("down", "unload", {"lora_name": "kept"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == \
        "state_store_unavailable", refused.text
    assert "kept" in _served(fleet.worker.address) and "kept" in fleet.wanted()


def test_loads_outlive_a_router_restart_and_reach_a_later_worker(fleet, adapter) -> None:
    _load(fleet, "a", "durable", adapter)
    _load(fleet, "b", "via-b", adapter)
    _load(fleet, "a", "dropped", adapter)
    unloaded = fleet.post("b", "unload", {"lora_name": "dropped"})
    assert unloaded.status_code == 200, unloaded.text
    assert {"durable", "via-b"} <= fleet.wanted() and "dropped" not in fleet.wanted()
    # with a gone, b alone re-asserts the shared record, a's loads included
    fleet.gateways["a"].terminate()
    fleet.restart_router()
    wait_for(lambda: {"durable", "via-b"} <= fleet.wanted(), timeout=RESTART_S,
             what="gateway b re-asserts the loads (one made through a) to the new router")
    assert any("re-asserted runtime LoRA adapter durable" in line
               for line in fleet.gateways["b"].output)
    metrics_port = free_port()
    late, address = launch_sim_worker("sim-worker-2", *SIM_LORA, f"--metrics-port={metrics_port}",
                                      f"--router={fleet.router.address}")
    fleet.services.append(late)
    late.wait_ready()
    wait_for(lambda: {"durable", "via-b"} <= _served(address), timeout=RESTART_S,
             what="the new router loads the adapters onto the worker that started after it")
    assert "dropped" not in _served(address) and "dropped" not in fleet.wanted()
    _drain_all_but(fleet, address)
    client = fleet.client("b")
    wait_for(lambda: _answers(client, "durable"), timeout=RESTART_S,
             what="requests for the adapter run on the later worker")
    assert scrape(f"http://127.0.0.1:{metrics_port}/metrics",
                  "baton_lora_generation_tokens_total", lora_name="durable") > 0
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="dropped", prompt="Hello", max_tokens=4)
