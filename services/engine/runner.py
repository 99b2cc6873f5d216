"""What the engine runs its steps on: its own ModelRunner, or under `engine=sim` a timed stand-in
that the caller hands in (baton.loadtest's SimulatedRunner), so that the engine package never
imports the load-test package."""
from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol

import torch
from transformers import PretrainedConfig

from baton.services.engine.config import EngineConfig
from baton.services.engine.scheduler import ScheduledSeq


class Runner(Protocol):
    num_blocks: int

    @property
    def kv_cache(self) -> torch.Tensor: ...

    def execute(self, scheduled: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """The items that sample, in packed order, and their float32 logits."""
        ...


# Builds the stand-in from the engine's config, the model's config and the token ids it must
# never emit (EOS and the like).
SimRunnerFactory = Callable[[EngineConfig, PretrainedConfig, Collection[int]], Runner]
