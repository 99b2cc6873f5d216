"""The Responses API and usage metering against real stores: SQLite files and PostgreSQL on
127.0.0.1:5432 (trust auth), the session its own database, created and dropped. Without
PostgreSQL these tests fail: they never skip.

One stack (`baton serve`'s colocated mode, the embedded model) for them all, its gateway on a
SQLite store; further gateways join its router on other stores."""
from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import openai
import pytest

from baton.services.checkpoints.tiny_model import embedded_model_path
from baton.services.common.process import ServiceProcess
from tests.launcher import (Stack, launch_gateway, launch_router, launch_sim_worker, start_stack,
                            stop_all)

PG = "postgresql://postgres@127.0.0.1:5432"
KEYS = """
tenants:
  - name: alpha
    keys: ["sk-alpha"]
  - name: beta
    keys: ["sk-beta"]
"""
MODEL = "tiny-llama"


async def pg_admin(statement: str) -> None:
    """Runs one statement on the server's `postgres` database (creating and dropping others)."""
    conn = await asyncpg.connect(f"{PG}/postgres", timeout=30)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@contextlib.contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """The URL of a new PostgreSQL database, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    asyncio.run(pg_admin(f'CREATE DATABASE "{name}"'))
    try:
        yield f"{PG}/{name}"
    finally:
        # WITH (FORCE): a gateway killed mid-test may have left a connection behind
        asyncio.run(pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for the session."""
    with fresh_database("baton_test") as url:
        yield url


@pytest.fixture(scope="session")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    path.write_text(KEYS)
    return path


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('state')}/state.db"


@pytest.fixture(scope="session")
def stack(keys_file: Path, sqlite_url: str) -> Iterator[Stack]:
    stack = start_stack(embedded_model_path(), "colocated", api_keys_file=keys_file,
                        gateway_args=["--slos=", f"--state-store={sqlite_url}",
                                      "--usage-update-interval-s=0.5"])
    yield stack
    stack.stop()


class Gateways:
    """Gateways started beside the stack's, on its router; stopped with the module."""

    def __init__(self, stack: Stack, keys_file: Path) -> None:
        self.stack, self.keys_file = stack, keys_file
        self.started: list[ServiceProcess] = []
        self.urls: dict[str, str] = {}

    def get(self, name: str, store: str, *extra: str) -> str:
        """The API URL of the gateway of this name, started (ready) on `store` if it is not."""
        if name not in self.urls:
            self.urls[name] = self.start(store, *extra)
        return self.urls[name]

    def start(self, store: str, *extra: str) -> str:
        """A ready gateway on `store`; its API URL."""
        service, port = launch_gateway(f"gateway-{len(self.started)}", self.stack.router.address,
                                       f"--api-keys-file={self.keys_file}",
                                       f"--state-store={store}", "--slos=", *extra)
        self.started.append(service)
        service.wait_ready()
        return f"http://127.0.0.1:{port}/v1"

    def stop(self) -> None:
        stop_all([s for s in self.started if s.process.poll() is None])


@pytest.fixture(scope="session")
def gateways(stack: Stack, keys_file: Path) -> Iterator[Gateways]:
    started = Gateways(stack, keys_file)
    yield started
    started.stop()


def client(url: str, key: str = "sk-alpha") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)


class SimStack:
    """A simulated worker slowed to about 30 tokens a second, a router, and gateways on SQLite
    stores, each started on demand: a long request is still running whatever the machine's load
    when a test acts on it."""

    def __init__(self, tmp: Path, keys_file: Path) -> None:
        self.tmp, self.keys_file = tmp, keys_file
        self.services: list[ServiceProcess] = []
        worker, address = launch_sim_worker("sim-worker", "--sim-step-base-seconds=0.03")
        self.services.append(worker)
        self.router, _ = launch_router("router", "--workers", address)
        self.services.append(self.router)
        self.router.wait_ready()
        worker.wait_ready()

    def gateway(self, db: Path, *extra: str) -> tuple[ServiceProcess, str]:
        service, port = launch_gateway(
            f"gateway-{len(self.services)}", self.router.address,
            f"--api-keys-file={self.keys_file}",
            f"--state-store=sqlite:///{db}", "--usage-update-interval-s=0.3", "--slos=", *extra)
        self.services.insert(0, service)
        service.wait_ready()
        return service, f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="session")
def sim(tmp_path_factory: pytest.TempPathFactory, keys_file: Path) -> Iterator[SimStack]:
    stack = SimStack(tmp_path_factory.mktemp("usage"), keys_file)
    yield stack
    stop_all([s for s in stack.services if s.process.poll() is None])


@pytest.fixture(scope="session")
def served(sim: SimStack) -> tuple[Path, openai.OpenAI]:
    """The SQLite file and a client of the first simulated stack's gateway."""
    db = sim.tmp / "usage.db"
    _, url = sim.gateway(db)
    return db, openai.OpenAI(base_url=url, api_key="sk-alpha", max_retries=0, timeout=120)
