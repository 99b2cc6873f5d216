"""The real Redis the tests use (127.0.0.1:6379, ../shared/ENVIRONMENT.md): a test that needs it
fails, never skips, when it is missing; each test works under a key prefix of its own and removes
its keys afterwards."""
from __future__ import annotations

import uuid

import pytest
import redis

REDIS_URL = "redis://127.0.0.1:6379/0"


def connect() -> redis.Redis:
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=10)
    try:
        client.ping()
    except redis.ConnectionError as e:
        raise AssertionError(f"these tests need Redis at {REDIS_URL}: {e}") from e
    return client


def new_prefix() -> str:
    return f"baton-test:{uuid.uuid4().hex}:"


def drop(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


def saved_level(client: redis.Redis, prefix: str, tenant: str, what: str) -> float | None:
    """A bucket's level as last written (not refilled to now); None when it has no key."""
    value = client.hget(f"{prefix}{{{tenant}}}:{what}", "level")
    return None if value is None else float(value)


@pytest.fixture
def prefix():
    """A key prefix of the test's own, its keys removed afterwards (import it as a fixture)."""
    client = connect()
    prefix = new_prefix()
    yield prefix
    drop(client, prefix)
