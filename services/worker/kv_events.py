"""The worker's KV-event log: block-stored and block-removed events with sequence numbers, kept in a
bounded buffer so a reconnecting consumer (the router's prefix index) can resume, or learn it must
resync."""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from baton.services.engine.kv.block_manager import Medium, MediumEvent
from baton.services.engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class KVEvent:
    sequence: int
    kind: str  # "stored" | "removed"
    block_hash: int
    medium: Medium = "device"  # the cache or KV tier it is about


class KVEventLog:
    def __init__(self, capacity: int) -> None:
        self._events: deque[KVEvent] = deque(maxlen=capacity)
        self._last = 0
        self._lock = threading.Lock()  # appended on the engine thread, read on the event loop

    @property
    def last_sequence(self) -> int:
        return self._last

    def extend(self, events: list[MediumEvent]) -> None:
        with self._lock:
            for kind, block_hash, medium in events:
                self._last += 1
                self._events.append(KVEvent(self._last, kind, block_hash, medium))

    def drain(self, engine: LLMEngine) -> None:
        """Moves the engine's new block events into the log: the one place they are drained (on the
        engine thread)."""
        events = engine.drain_block_events()
        if events:
            self.extend(events)

    def since(self, after: int) -> tuple[list[KVEvent], bool]:
        """Events with sequence > after, and whether some of those were already dropped (a gap)."""
        with self._lock:
            if not self._events or after >= self._last:
                return [], False
            oldest = self._events[0].sequence
            gap = after + 1 < oldest and after != 0
            start = max(0, after + 1 - oldest)
            return [self._events[i] for i in range(start, len(self._events))], gap
