"""LoRA under tensor parallelism: every rank keeps the same slot table as rank 0.

Rank 0's LoRAManager alone decides which adapter is read, which slot it takes and when it leaves
host memory; LoRAReplicas tells the other ranks each decision as it is made, on the channel that
carries the step inputs (so in order, before the step that uses it). Each rank reads the adapter
from disk itself, on its own loader thread started as soon as rank 0 starts its read, and keeps
only its slices in its slots (weights.py); the per-token slots then travel with each sequence's
step inputs, only when they change (parallel/step_sync.py)."""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from transformers import PretrainedConfig

from baton.services.engine.config import EngineConfig
from baton.services.engine.lora.adapter import AdapterWeights, read_adapter
from baton.services.engine.lora.modules import LoRAModule
from baton.services.engine.lora.weights import LoRAState, write_slot


@dataclass(frozen=True)
class ReadAdapter:
    """Start reading this adapter into host memory."""
    module: LoRAModule


@dataclass(frozen=True)
class FillSlot:
    """Copy the adapter `name` (read after a ReadAdapter) into device slot `slot`."""
    slot: int
    name: str


@dataclass(frozen=True)
class DropAdapter:
    """Rank 0's host cache let the adapter go (evicted or unloaded)."""
    name: str


LoRAEvent = ReadAdapter | FillSlot | DropAdapter


class LoRAReplicas:
    """Rank 0's side: each manager decision, sent to the other ranks at once."""

    def __init__(self, send: Callable[[Any], None]) -> None:
        self._send = send

    def read(self, module: LoRAModule) -> None:
        self._send(ReadAdapter(module))

    def fill(self, slot: int, name: str) -> None:
        self._send(FillSlot(slot, name))

    def drop(self, name: str) -> None:
        self._send(DropAdapter(name))


class LoRAFollower:
    """A rank other than 0: reads what rank 0 reads, fills the slots rank 0 fills."""

    def __init__(self, engine: EngineConfig, model_config: PretrainedConfig,
                 state: LoRAState) -> None:
        self.model_config = model_config
        self.max_rank = engine.max_lora_rank
        self.state = state
        self.host: dict[str, Future[AdapterWeights]] = {}
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="lora-loader")

    def apply(self, event: LoRAEvent) -> None:
        if isinstance(event, ReadAdapter):
            module = event.module
            self.host[module.name] = self._loader.submit(
                read_adapter, module.name, module.path, self.model_config, self.max_rank)
        elif isinstance(event, FillSlot):
            # Rank 0 read it without error; this rank failing to (its files changed under it)
            # raises, and the rank exits rather than compute with another adapter than rank 0.
            write_slot(self.state, event.slot, self.host[event.name].result())
        else:
            self.host.pop(event.name, None)

    def close(self) -> None:
        self._loader.shutdown(wait=False, cancel_futures=True)
