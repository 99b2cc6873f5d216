"""The connection to the state store: SQLite (`sqlite:///path`, aiosqlite) or PostgreSQL
(`postgresql://...`, asyncpg), behind SQLAlchemy's async engine. The schema is migrated (Alembic, to
the newest version) before first use, under a lock so gateways starting together migrate once. A
store that cannot be reached raises StoreUnavailable (the gateway answers 503), and is tried again
on the next use: a gateway starts and serves unstored requests while its store is down."""
from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from baton.services.state.urls import StoreUnavailable, engine_url

log = logging.getLogger(__name__)
# Alembic logs each plugin and step at INFO; the store logs the one line that matters.
logging.getLogger("alembic").setLevel(logging.WARNING)
MIGRATIONS = Path(__file__).parent / "migrations"
# Any fixed number: the PostgreSQL advisory lock that serializes migrations across gateways.
_MIGRATION_LOCK = 2026112801


def _upgrade(connection: Connection) -> None:
    # imported here: Alembic logs its plugins as it loads, before its logger could be quietened
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


# A gateway waits this long for another one's migration of a shared SQLite file, then starts
# without its store (retried when a request needs it) rather than hang before it serves.
MIGRATION_LOCK_WAIT_S = 30.0


async def _lock_within(lock_file: IO[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise StoreUnavailable(f"another gateway has held {lock_file.name} for over "
                                       f"{seconds:.0f} s") from None
            await asyncio.sleep(0.1)


class StateStore:
    def __init__(self, url: str, connect_timeout_s: float = 5.0) -> None:
        self.url = engine_url(url)
        parsed = make_url(self.url)
        self.sqlite = parsed.get_backend_name() == "sqlite"
        self.path = Path(parsed.database) if self.sqlite and parsed.database else None
        # SQLite waits for a writer up to the timeout; asyncpg gives up connecting after it.
        args: dict[str, Any] = {"timeout": 30.0 if self.sqlite else connect_timeout_s}
        self.engine = create_async_engine(self.url, connect_args=args, pool_pre_ping=True)
        self._migrated = False
        self._lock: asyncio.Lock | None = None

    def describe(self) -> str:
        """The URL without its password, for logs."""
        return make_url(self.url).render_as_string(hide_password=True)

    async def ready(self) -> None:
        """Migrates the schema unless done; StoreUnavailable when the store cannot be reached."""
        if self._migrated:
            return
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if not self._migrated:
                await self._migrate()
                self._migrated = True
                log.info("state store %s: schema up to date", self.describe())

    async def _migrate(self) -> None:
        lock_file = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # gateways sharing the file must not each create the tables
            lock_file = open(f"{self.path}.lock", "w")  # noqa: SIM115 (closed below)
            try:
                await _lock_within(lock_file, MIGRATION_LOCK_WAIT_S)
            except BaseException:
                lock_file.close()
                raise
        try:
            async with self.connect() as conn:
                if not self.sqlite:
                    await conn.execute(text(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})"))
                await conn.run_sync(_upgrade)
        finally:
            if lock_file is not None:
                lock_file.close()

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """A connection in a transaction, committed when the block ends; store failures become
        StoreUnavailable."""
        try:
            async with self.engine.begin() as conn:
                yield conn
        except (SQLAlchemyError, OSError, asyncio.TimeoutError) as e:
            raise StoreUnavailable(f"the state store is unavailable: {type(e).__name__}") from e

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """connect(), once the schema is migrated."""
        await self.ready()
        async with self.connect() as conn:
            yield conn

    async def close(self) -> None:
        await self.engine.dispose()
