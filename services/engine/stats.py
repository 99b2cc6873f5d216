"""What the engine counts as it runs, and the snapshot of its load that a worker reports."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from baton.services.common.decode_cost import DecodeCostFit, DecodeCostModel
from baton.services.engine.lora.manager import LoRAStats


@dataclass
class EngineCounters:
    # prefill tokens actually run through the model (cache hits excluded)
    prompt_tokens_computed: int = 0
    generation_tokens: int = 0
    steps: int = 0
    requests_finished: int = 0
    recent_step_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=32))
    # (prompt tokens, seconds) of recent steps that computed prompt tokens, decode rows in them
    # included.
    recent_prefill_steps: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=32))
    decode_cost: DecodeCostModel = field(default_factory=DecodeCostModel)

    def prefill_tokens_per_s(self) -> float | None:
        """How fast this engine has been getting through prompt tokens lately, under its real mix of
        work: what the router divides a queue of prompt tokens by to predict a wait. None before any
        prefill."""
        seconds = sum(s for _, s in self.recent_prefill_steps)
        return sum(t for t, _ in self.recent_prefill_steps) / seconds if seconds > 0 else None


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's load, what a worker reports to the router."""
    num_running: int
    num_waiting: int
    kv_blocks_free: int
    kv_blocks_total: int
    prefill_tokens_queued: int
    decode_rows: int  # running requests past their prompt: the batch a new one would join
    decode_context_tokens: int
    decode_fit: DecodeCostFit | None
    recent_step_seconds: list[float]
    prefill_tokens_per_s: float | None
    lora: LoRAStats | None = None  # None: LoRA is off
    lora_running: list[str] = field(default_factory=list)  # adapters of running requests
    lora_waiting: list[str] = field(default_factory=list)  # adapters of waiting requests
    # KV tier -> measured seconds to load one block from it (TierManager.load_seconds_per_block)
    tier_load_seconds_per_block: dict[str, float] = field(default_factory=dict)
