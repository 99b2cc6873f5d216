"""Affinity keys (OpenAI's `prompt_cache_key`): a client's name for requests that share a prefix, or
a conversation, whatever their prompts look like to the prefix index. The router remembers where
each key's last request went, so the affinity-key scorer can keep the next one there."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class AffinityKeys:
    """(tenant, key) -> the workers its last placement used, the least recently used forgotten past
    `capacity` (keys are client-chosen: the table must not grow without bound). Not thread-safe:
    the router calls it under its lock."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._workers: OrderedDict[tuple[str, str], frozenset[str]] = OrderedDict()

    def workers_for(self, tenant: str, key: str) -> frozenset[str]:
        """The workers the key's last request was placed on (none for no key, or a new one)."""
        if not key:
            return frozenset()
        found = self._workers.get((tenant, key))
        if found is None:
            return frozenset()
        self._workers.move_to_end((tenant, key))
        return found

    def record(self, tenant: str, key: str, worker_ids: Iterable[str]) -> None:
        """Where the key's request was just placed: its next one prefers these workers."""
        if not key or self.capacity == 0:
            return
        self._workers[(tenant, key)] = frozenset(worker_ids)
        self._workers.move_to_end((tenant, key))
        while len(self._workers) > self.capacity:
            self._workers.popitem(last=False)

    def __len__(self) -> int:
        return len(self._workers)
