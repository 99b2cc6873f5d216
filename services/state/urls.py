"""State-store URLs, checked where the configuration is read (without loading SQLAlchemy)."""
from __future__ import annotations

_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg",
            "postgres": "postgresql+asyncpg"}


class StoreUnavailable(Exception):
    """The store cannot be reached or refused the operation (the gateway answers 503)."""


def engine_url(url: str) -> str:
    """The SQLAlchemy URL with its async driver; ValueError for a scheme the store does not take."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"state store {url!r}: expected sqlite:///PATH or postgresql://...")
    base = scheme.split("+")[0]
    if base not in _DRIVERS:
        raise ValueError(f"state store {url!r}: the scheme must be sqlite or postgresql")
    return f"{_DRIVERS[base]}://{rest}"
