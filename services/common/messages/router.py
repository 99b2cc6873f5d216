"""The Router contract's messages as plain values (router.proto's PlaceRequest, Placement,
ReleaseRequest, RouterStats): what the gateway asks and learns, and what the router decides on.
They meet their wire forms in one place, services/common/wire/router.py."""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from baton.services.common.roles import Role


class DisaggReason(str, enum.Enum):
    """Why a placement prefills remotely or on its decode worker (Placement's
    disaggregation_reason)."""
    NO_PREFILL_WORKER = "no_prefill_worker"
    SHORT_PREFILL = "short_prefill"
    LONG_PREFILL = "long_prefill"
    PREFILL_POOL_BUSY = "prefill_pool_busy"
    DECODE_KV_LOW = "decode_kv_low"
    DECODE_BUSIER = "decode_busier"


@dataclass(frozen=True)
class PlaceRequest:
    request_id: str
    prompt_token_ids: Sequence[int]
    tenant: str = ""
    cache_salt: str | None = None
    priority: int = 0
    max_tokens: int = 0
    # also the deadline for leaving the queue; None: the configured default
    ttft_slo_s: float | None = None
    tpot_slo_s: float | None = None  # None: the configured default
    # workers the request's stream broke on before (a migration); never chosen again
    excluded_worker_ids: frozenset[str] = frozenset()
    # the caller streams a remote prefill's first token at once: no decode join wait in its TTFT
    first_token_at_prefill: bool = False
    # the client's prompt_cache_key: requests sharing it stay on one worker while it keeps up
    affinity_key: str = ""
    lora_name: str | None = None  # the LoRA adapter the request runs under; None: the base model
    model: str | None = None  # the base model it runs on (an adapter's parent); None: the router's


@dataclass(frozen=True)
class Placement:
    request_id: str
    lease_id: str
    decode_worker_id: str
    decode_address: str
    prefill_worker_id: str | None  # None: the decode worker computes the prompt itself
    prefill_address: str | None
    predicted_ttft_s: float
    cached_tokens: int  # prompt tokens the index expects the computing worker to hold already
    reason: str  # how the decode worker was picked: prefix_affinity, load or all_saturated
    disagg_reason: DisaggReason


@dataclass(frozen=True)
class Release:
    """The end of a placement's lease, with what the caller saw."""
    lease_id: str
    # placement to first token, when a fresh prefill on this placement produced it
    observed_ttft_s: float | None = None
    output_tokens: int | None = None
    failed_worker_id: str | None = None  # the worker the request failed on, if any


@dataclass(frozen=True)
class PoolStats:
    workers: int
    queued_prefill_tokens: int
    inflight_requests: int
    mean_kv_utilization: float
    saturated: int


@dataclass(frozen=True)
class ModelStats:
    """One model a router routes, as its live workers report it."""
    name: str
    max_model_len: int = 0  # the smallest limit its live workers report; 0: none yet
    lora_adapters: tuple[str, ...] = ()  # served by its workers (their parent is this model)
    workers: int = 0
    # the router's desired state of adapters loaded at runtime: (name, folder) pairs
    runtime_loras: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class RouterStats:
    pools: dict[Role, PoolStats]
    queued_requests: int
    leases: int
    model: str = ""
    # the smallest limit the live workers report (a request must fit wherever it lands); 0: none yet
    max_model_len: int = 0
    lora_adapters: tuple[str, ...] = ()  # served by its live workers
    # every model the router routes, its own --model first (the fields above repeat that one's)
    served_models: tuple[ModelStats, ...] = ()
