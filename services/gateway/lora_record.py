"""The gateway's record of the LoRA adapters loaded at runtime, which it re-asserts to the router
(services/gateway/lora_reconcile.py): the state store's table (services/state/lora_repo.py), shared
by every gateway on one PostgreSQL, or without a store this gateway's memory, which still outlives
a router restart. A store that cannot be reached raises StoreUnavailable, counted."""
from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from prometheus_client import Counter

from baton.services.state.lora_repo import (Recorded, record_load, record_unload,
                                            recorded_loras)
from baton.services.state.store import StateStore
from baton.services.state.urls import StoreUnavailable

OPERATION = "lora_adapters"  # the store-failures counter's label
T = TypeVar("T")


class LoRARecord:
    def __init__(self, store: StateStore | None, failures: Counter | None = None) -> None:
        self.store, self._failures = store, failures
        self._memory: Recorded = {}

    async def all(self) -> Recorded:
        """(base model, adapter name) -> folder."""
        if self.store is None:
            return dict(self._memory)
        return await self._counted(recorded_loras(self.store))

    async def add(self, model: str, name: str, path: str) -> None:
        if self.store is None:
            self._memory[(model, name)] = path
        else:
            await self._counted(record_load(self.store, model, name, path))

    async def remove(self, model: str, name: str) -> None:
        if self.store is None:
            self._memory.pop((model, name), None)
        else:
            await self._counted(record_unload(self.store, model, name))

    async def _counted(self, operation: Awaitable[T]) -> T:
        try:
            return await operation
        except StoreUnavailable:
            if self._failures is not None:
                self._failures.labels(OPERATION).inc()
            raise
