"""Runs migrations on the connection StateStore.migrate passes in config.attributes; the store is
never migrated from a URL here, so the one engine (and its driver) the gateway uses does it."""
from __future__ import annotations

from alembic import context

from baton.services.state.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
