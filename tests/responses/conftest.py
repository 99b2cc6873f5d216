"""The Responses API and usage metering against real stores: SQLite files and PostgreSQL on
127.0.0.1:5432 (trust auth), each test module its own database, created and dropped. Without
PostgreSQL these tests fail: they never skip.

One stack (`baton serve`'s colocated mode, the embedded model) per module, its gateway on a SQLite
store; further gateways join its router on other stores."""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import openai
import pytest

from baton.services.checkpoints.tiny_model import embedded_model_path
from baton.services.common.process import ServiceProcess
from tests.launcher import Stack, launch_gateway, start_stack, stop_all

PG = "postgresql://postgres@127.0.0.1:5432"
KEYS = """
tenants:
  - name: alpha
    keys: ["sk-alpha"]
  - name: beta
    keys: ["sk-beta"]
"""
MODEL = "tiny-llama"


async def _admin(statement: str) -> None:
    conn = await asyncpg.connect(f"{PG}/postgres", timeout=30)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for the module, dropped after it."""
    name = f"baton_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    yield f"{PG}/{name}"
    # WITH (FORCE): a gateway killed mid-test may have left a connection behind
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    path.write_text(KEYS)
    return path


@pytest.fixture(scope="module")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('state')}/state.db"


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
def gateways(stack: Stack, keys_file: Path) -> Iterator[Gateways]:
    started = Gateways(stack, keys_file)
    yield started
    started.stop()


def client(url: str, key: str = "sk-alpha") -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120)
