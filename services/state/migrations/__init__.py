"""Alembic's script folder for the state store: env.py runs the versions on the connection the store
hands it (services/state/store.py:StateStore.migrate)."""
