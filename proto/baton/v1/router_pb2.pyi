from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_ROLE_UNSPECIFIED: _ClassVar[WorkerRole]
    WORKER_ROLE_PREFILL: _ClassVar[WorkerRole]
    WORKER_ROLE_DECODE: _ClassVar[WorkerRole]
    WORKER_ROLE_MIXED: _ClassVar[WorkerRole]

class PlacementReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLACEMENT_REASON_UNSPECIFIED: _ClassVar[PlacementReason]
    PLACEMENT_REASON_PREFIX_AFFINITY: _ClassVar[PlacementReason]
    PLACEMENT_REASON_LOAD: _ClassVar[PlacementReason]
    PLACEMENT_REASON_ALL_SATURATED: _ClassVar[PlacementReason]

class PrefillMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREFILL_MODE_UNSPECIFIED: _ClassVar[PrefillMode]
    PREFILL_MODE_LOCAL: _ClassVar[PrefillMode]
    PREFILL_MODE_REMOTE: _ClassVar[PrefillMode]
WORKER_ROLE_UNSPECIFIED: WorkerRole
WORKER_ROLE_PREFILL: WorkerRole
WORKER_ROLE_DECODE: WorkerRole
WORKER_ROLE_MIXED: WorkerRole
PLACEMENT_REASON_UNSPECIFIED: PlacementReason
PLACEMENT_REASON_PREFIX_AFFINITY: PlacementReason
PLACEMENT_REASON_LOAD: PlacementReason
PLACEMENT_REASON_ALL_SATURATED: PlacementReason
PREFILL_MODE_UNSPECIFIED: PrefillMode
PREFILL_MODE_LOCAL: PrefillMode
PREFILL_MODE_REMOTE: PrefillMode

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "address", "role", "model", "block_size")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    role: WorkerRole
    model: str
    block_size: int
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., role: _Optional[_Union[WorkerRole, str]] = ..., model: _Optional[str] = ..., block_size: _Optional[int] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("lease_expires_at_unix_ms", "lease_ttl_ms")
    LEASE_EXPIRES_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    lease_expires_at_unix_ms: int
    lease_ttl_ms: int
    def __init__(self, lease_expires_at_unix_ms: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("lease_expires_at_unix_ms",)
    LEASE_EXPIRES_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    lease_expires_at_unix_ms: int
    def __init__(self, lease_expires_at_unix_ms: _Optional[int] = ...) -> None: ...

class PlaceRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "tenant", "cache_salt", "priority", "max_tokens", "ttft_slo_ms", "tpot_slo_ms", "excluded_worker_ids", "first_token_at_prefill", "affinity_key", "lora_name", "model")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_SLO_MS_FIELD_NUMBER: _ClassVar[int]
    TPOT_SLO_MS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDED_WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_AT_PREFILL_FIELD_NUMBER: _ClassVar[int]
    AFFINITY_KEY_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    tenant: str
    cache_salt: str
    priority: int
    max_tokens: int
    ttft_slo_ms: int
    tpot_slo_ms: int
    excluded_worker_ids: _containers.RepeatedScalarFieldContainer[str]
    first_token_at_prefill: bool
    affinity_key: str
    lora_name: str
    model: str
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., tenant: _Optional[str] = ..., cache_salt: _Optional[str] = ..., priority: _Optional[int] = ..., max_tokens: _Optional[int] = ..., ttft_slo_ms: _Optional[int] = ..., tpot_slo_ms: _Optional[int] = ..., excluded_worker_ids: _Optional[_Iterable[str]] = ..., first_token_at_prefill: _Optional[bool] = ..., affinity_key: _Optional[str] = ..., lora_name: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("request_id", "lease_id", "decode_worker_id", "decode_address", "prefill_worker_id", "prefill_address", "prefill_mode", "disaggregation_reason", "reason", "predicted_ttft_ms", "predicted_cached_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    DECODE_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DECODE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PREFILL_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MODE_FIELD_NUMBER: _ClassVar[int]
    DISAGGREGATION_REASON_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    lease_id: str
    decode_worker_id: str
    decode_address: str
    prefill_worker_id: str
    prefill_address: str
    prefill_mode: PrefillMode
    disaggregation_reason: str
    reason: PlacementReason
    predicted_ttft_ms: int
    predicted_cached_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., decode_worker_id: _Optional[str] = ..., decode_address: _Optional[str] = ..., prefill_worker_id: _Optional[str] = ..., prefill_address: _Optional[str] = ..., prefill_mode: _Optional[_Union[PrefillMode, str]] = ..., disaggregation_reason: _Optional[str] = ..., reason: _Optional[_Union[PlacementReason, str]] = ..., predicted_ttft_ms: _Optional[int] = ..., predicted_cached_tokens: _Optional[int] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("request_id", "reason", "message", "retry_after_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    reason: str
    message: str
    retry_after_ms: int
    def __init__(self, request_id: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id", "observed_ttft_ms", "output_tokens", "failed_worker_id")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FAILED_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    observed_ttft_ms: int
    output_tokens: int
    failed_worker_id: str
    def __init__(self, lease_id: _Optional[str] = ..., observed_ttft_ms: _Optional[int] = ..., output_tokens: _Optional[int] = ..., failed_worker_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DrainRequest(_message.Message):
    __slots__ = ("worker_ids",)
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    worker_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DrainResponse(_message.Message):
    __slots__ = ("unknown_worker_ids",)
    UNKNOWN_WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    unknown_worker_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, unknown_worker_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetRouterStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolStats(_message.Message):
    __slots__ = ("role", "workers", "queued_prefill_tokens", "inflight_requests", "mean_kv_utilization", "saturated_workers")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MEAN_KV_UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    SATURATED_WORKERS_FIELD_NUMBER: _ClassVar[int]
    role: WorkerRole
    workers: int
    queued_prefill_tokens: int
    inflight_requests: int
    mean_kv_utilization: float
    saturated_workers: int
    def __init__(self, role: _Optional[_Union[WorkerRole, str]] = ..., workers: _Optional[int] = ..., queued_prefill_tokens: _Optional[int] = ..., inflight_requests: _Optional[int] = ..., mean_kv_utilization: _Optional[float] = ..., saturated_workers: _Optional[int] = ...) -> None: ...

class RouterStats(_message.Message):
    __slots__ = ("pools", "queued_requests", "leases", "model", "max_model_len", "lora_adapters", "served_models")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    SERVED_MODELS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolStats]
    queued_requests: int
    leases: int
    model: str
    max_model_len: int
    lora_adapters: _containers.RepeatedScalarFieldContainer[str]
    served_models: _containers.RepeatedCompositeFieldContainer[ServedModel]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolStats, _Mapping]]] = ..., queued_requests: _Optional[int] = ..., leases: _Optional[int] = ..., model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., lora_adapters: _Optional[_Iterable[str]] = ..., served_models: _Optional[_Iterable[_Union[ServedModel, _Mapping]]] = ...) -> None: ...

class ServedModel(_message.Message):
    __slots__ = ("name", "max_model_len", "lora_adapters", "workers", "runtime_loras")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_LORAS_FIELD_NUMBER: _ClassVar[int]
    name: str
    max_model_len: int
    lora_adapters: _containers.RepeatedScalarFieldContainer[str]
    workers: int
    runtime_loras: _containers.RepeatedCompositeFieldContainer[RuntimeLoRA]
    def __init__(self, name: _Optional[str] = ..., max_model_len: _Optional[int] = ..., lora_adapters: _Optional[_Iterable[str]] = ..., workers: _Optional[int] = ..., runtime_loras: _Optional[_Iterable[_Union[RuntimeLoRA, _Mapping]]] = ...) -> None: ...

class RuntimeLoRA(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerEndpoint(_message.Message):
    __slots__ = ("worker_id", "address", "role", "draining", "model")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    role: WorkerRole
    draining: bool
    model: str
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., role: _Optional[_Union[WorkerRole, str]] = ..., draining: _Optional[bool] = ..., model: _Optional[str] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerEndpoint]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerEndpoint, _Mapping]]] = ...) -> None: ...

class SetRuntimeLoRARequest(_message.Message):
    __slots__ = ("model", "lora_name", "lora_path", "worker_ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    LORA_PATH_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    lora_name: str
    lora_path: str
    worker_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., lora_name: _Optional[str] = ..., lora_path: _Optional[str] = ..., worker_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SetRuntimeLoRAResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
