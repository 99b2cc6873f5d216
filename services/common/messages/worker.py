"""What the router reads from the workers, as plain values: a worker's load (worker.proto's
WorkerStats) and its prefix cache (KVEventBatch, KVSnapshot). They meet their wire forms in one
place, services/common/wire/router.py."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from baton.services.common.decode_cost import DecodeCostFit
from baton.services.common.roles import Role


@dataclass(frozen=True)
class LoadReport:
    """The fields of a baton.v1.WorkerStats the router uses, copied so later proto reuse cannot
    alter them."""
    timestamp_s: float
    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefill_tokens_queued: int = 0
    draining: bool = False
    # the worker's fit of its decode step time; None before one
    decode_cost: DecodeCostFit | None = None
    decode_rows: int = 0
    decode_context_tokens: int = 0
    max_model_len: int = 0  # the longest sequence the worker accepts; 0: not reported
    # Who reports, for the feed that registers a worker it discovered.
    worker_id: str = ""
    role: Role | None = None  # None: a role this router does not know
    model: str = ""
    block_size: int = 0
    prefill_tokens_per_s: float = 0.0  # measured; 0 before a measurement
    lora_adapters: frozenset[str] = frozenset()  # LoRA adapters served
    loaded_loras: frozenset[str] = frozenset()  # of those, in a device slot now
    # measured seconds to load one block from the worker's KV tiers; 0: off or not measured
    host_load_seconds_per_block: float = 0.0
    disk_load_seconds_per_block: float = 0.0


class EventKind(enum.IntEnum):
    """Numbered as baton.v1.KVEvent.Kind."""
    STORED = 1
    REMOVED = 2
    CLEARED = 3


class Medium(enum.IntEnum):
    """Where a block is (vLLM's events: "GPU", "CPU", "DISK"); numbered as baton.v1.KVMedium."""
    DEVICE = 0
    HOST = 1
    DISK = 2


@dataclass(frozen=True)
class KVEvent:
    sequence: int
    kind: EventKind
    block_hashes: tuple[int, ...]
    medium: Medium = Medium.DEVICE


@dataclass(frozen=True)
class KVEventBatch:
    worker_id: str
    events: tuple[KVEvent, ...]
    gap: bool = False  # the worker's log dropped events before these: a snapshot must resync


@dataclass(frozen=True)
class KVSnapshot:
    """Every block a worker's prefix cache holds (and its KV tiers); its events resume after
    `sequence`."""
    worker_id: str
    sequence: int
    block_hashes: tuple[int, ...]
    host_block_hashes: tuple[int, ...] = ()
    disk_block_hashes: tuple[int, ...] = ()
