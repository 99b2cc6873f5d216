from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_PREFILL: _ClassVar[Role]
    ROLE_DECODE: _ClassVar[Role]
    ROLE_MIXED: _ClassVar[Role]

class KVMedium(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KV_MEDIUM_DEVICE: _ClassVar[KVMedium]
    KV_MEDIUM_HOST: _ClassVar[KVMedium]
    KV_MEDIUM_DISK: _ClassVar[KVMedium]
ROLE_UNSPECIFIED: Role
ROLE_PREFILL: Role
ROLE_DECODE: Role
ROLE_MIXED: Role
KV_MEDIUM_DEVICE: KVMedium
KV_MEDIUM_HOST: KVMedium
KV_MEDIUM_DISK: KVMedium

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty", "frequency_penalty", "presence_penalty", "stop", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens", "logprobs", "skip_special_tokens", "structured_output", "logit_bias", "prompt_logprobs")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    include_stop_str_in_output: bool
    ignore_eos: bool
    min_tokens: int
    logprobs: int
    skip_special_tokens: bool
    structured_output: StructuredOutput
    logit_bias: _containers.ScalarMap[int, float]
    prompt_logprobs: int
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., seed: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., include_stop_str_in_output: _Optional[bool] = ..., ignore_eos: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., logprobs: _Optional[int] = ..., skip_special_tokens: _Optional[bool] = ..., structured_output: _Optional[_Union[StructuredOutput, _Mapping]] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., prompt_logprobs: _Optional[int] = ...) -> None: ...

class StructuredOutput(_message.Message):
    __slots__ = ("kind", "value")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    kind: str
    value: str
    def __init__(self, kind: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class RequestMeta(_message.Message):
    __slots__ = ("request_id", "priority", "cache_salt", "lora_name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    priority: int
    cache_salt: str
    lora_name: str
    def __init__(self, request_id: _Optional[str] = ..., priority: _Optional[int] = ..., cache_salt: _Optional[str] = ..., lora_name: _Optional[str] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("meta", "prompt_token_ids", "params")
    META_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    meta: RequestMeta
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    params: SamplingParams
    def __init__(self, meta: _Optional[_Union[RequestMeta, _Mapping]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., params: _Optional[_Union[SamplingParams, _Mapping]] = ...) -> None: ...

class KVHandle(_message.Message):
    __slots__ = ("request_id", "worker_id", "worker_address", "transport", "agent_name", "agent_host", "agent_port", "layout", "block_ids", "num_tokens", "expires_at_unix_ms", "block_hashes", "rank_peers", "head_layout", "head_row")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_HOST_FIELD_NUMBER: _ClassVar[int]
    AGENT_PORT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    RANK_PEERS_FIELD_NUMBER: _ClassVar[int]
    HEAD_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    HEAD_ROW_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    worker_id: str
    worker_address: str
    transport: str
    agent_name: str
    agent_host: str
    agent_port: int
    layout: KVLayout
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: int
    expires_at_unix_ms: int
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    rank_peers: _containers.RepeatedCompositeFieldContainer[KVRankPeer]
    head_layout: KVLayout
    head_row: bytes
    def __init__(self, request_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., worker_address: _Optional[str] = ..., transport: _Optional[str] = ..., agent_name: _Optional[str] = ..., agent_host: _Optional[str] = ..., agent_port: _Optional[int] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ..., block_ids: _Optional[_Iterable[int]] = ..., num_tokens: _Optional[int] = ..., expires_at_unix_ms: _Optional[int] = ..., block_hashes: _Optional[_Iterable[int]] = ..., rank_peers: _Optional[_Iterable[_Union[KVRankPeer, _Mapping]]] = ..., head_layout: _Optional[_Union[KVLayout, _Mapping]] = ..., head_row: _Optional[bytes] = ...) -> None: ...

class KVRankPeer(_message.Message):
    __slots__ = ("agent_name", "agent_host", "agent_port", "layout", "kv_head_start", "kv_head_count")
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_HOST_FIELD_NUMBER: _ClassVar[int]
    AGENT_PORT_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    KV_HEAD_START_FIELD_NUMBER: _ClassVar[int]
    KV_HEAD_COUNT_FIELD_NUMBER: _ClassVar[int]
    agent_name: str
    agent_host: str
    agent_port: int
    layout: KVLayout
    kv_head_start: int
    kv_head_count: int
    def __init__(self, agent_name: _Optional[str] = ..., agent_host: _Optional[str] = ..., agent_port: _Optional[int] = ..., layout: _Optional[_Union[KVLayout, _Mapping]] = ..., kv_head_start: _Optional[int] = ..., kv_head_count: _Optional[int] = ...) -> None: ...

class KVLayout(_message.Message):
    __slots__ = ("num_layers", "num_blocks", "block_size", "block_nbytes", "base_address", "dtype", "order")
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_NBYTES_FIELD_NUMBER: _ClassVar[int]
    BASE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    num_layers: int
    num_blocks: int
    block_size: int
    block_nbytes: int
    base_address: int
    dtype: str
    order: str
    def __init__(self, num_layers: _Optional[int] = ..., num_blocks: _Optional[int] = ..., block_size: _Optional[int] = ..., block_nbytes: _Optional[int] = ..., base_address: _Optional[int] = ..., dtype: _Optional[str] = ..., order: _Optional[str] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "rank", "top")
    class TopEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    rank: int
    top: _containers.ScalarMap[int, float]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., rank: _Optional[int] = ..., top: _Optional[_Mapping[int, float]] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("first_token_id", "first_logprob", "kv_handle", "num_cached_tokens", "finish_reason", "text", "stop_token_id", "stop_string", "prompt_logprobs")
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    KV_HANDLE_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    first_token_id: int
    first_logprob: TokenLogprob
    kv_handle: KVHandle
    num_cached_tokens: int
    finish_reason: str
    text: str
    stop_token_id: int
    stop_string: str
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, first_token_id: _Optional[int] = ..., first_logprob: _Optional[_Union[TokenLogprob, _Mapping]] = ..., kv_handle: _Optional[_Union[KVHandle, _Mapping]] = ..., num_cached_tokens: _Optional[int] = ..., finish_reason: _Optional[str] = ..., text: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., stop_string: _Optional[str] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("meta", "prompt_token_ids", "params", "kv_handle", "first_token_id", "first_logprob", "output_token_ids", "first_token_streamed")
    META_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    KV_HANDLE_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_STREAMED_FIELD_NUMBER: _ClassVar[int]
    meta: RequestMeta
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    params: SamplingParams
    kv_handle: KVHandle
    first_token_id: int
    first_logprob: TokenLogprob
    output_token_ids: _containers.RepeatedScalarFieldContainer[int]
    first_token_streamed: bool
    def __init__(self, meta: _Optional[_Union[RequestMeta, _Mapping]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., params: _Optional[_Union[SamplingParams, _Mapping]] = ..., kv_handle: _Optional[_Union[KVHandle, _Mapping]] = ..., first_token_id: _Optional[int] = ..., first_logprob: _Optional[_Union[TokenLogprob, _Mapping]] = ..., output_token_ids: _Optional[_Iterable[int]] = ..., first_token_streamed: _Optional[bool] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("token_ids", "text", "logprobs", "finished", "finish_reason", "stop_token_id", "stop_string", "num_prompt_tokens", "num_cached_tokens", "kv_source", "prompt_logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KV_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    finished: bool
    finish_reason: str
    stop_token_id: int
    stop_string: str
    num_prompt_tokens: int
    num_cached_tokens: int
    kv_source: str
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., stop_string: _Optional[str] = ..., num_prompt_tokens: _Optional[int] = ..., num_cached_tokens: _Optional[int] = ..., kv_source: _Optional[str] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class UpdateLeaseRequest(_message.Message):
    __slots__ = ("request_id", "release")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    release: bool
    def __init__(self, request_id: _Optional[str] = ..., release: _Optional[bool] = ...) -> None: ...

class UpdateLeaseResponse(_message.Message):
    __slots__ = ("found", "expires_at_unix_ms")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    found: bool
    expires_at_unix_ms: int
    def __init__(self, found: _Optional[bool] = ..., expires_at_unix_ms: _Optional[int] = ...) -> None: ...

class PullKVRequest(_message.Message):
    __slots__ = ("request_id", "block_ids", "with_head")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    WITH_HEAD_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    with_head: bool
    def __init__(self, request_id: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ..., with_head: _Optional[bool] = ...) -> None: ...

class KVChunk(_message.Message):
    __slots__ = ("layer", "block_id", "data")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    layer: int
    block_id: int
    data: bytes
    def __init__(self, layer: _Optional[int] = ..., block_id: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStats(_message.Message):
    __slots__ = ("worker_id", "role", "timestamp_unix_ms", "num_running", "num_waiting", "kv_blocks_used", "kv_blocks_total", "prefill_tokens_queued", "recent_step_ms", "num_leases", "draining", "block_size", "model", "prefill_tokens_per_s", "max_model_len", "decode_step_ms_base", "decode_step_ms_per_sequence", "decode_step_ms_per_ktoken", "decode_step_samples", "decode_rows", "decode_context_tokens", "lora_adapters", "loaded_loras", "host_load_seconds_per_block", "disk_load_seconds_per_block", "decode_tokens_per_row_step")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_QUEUED_FIELD_NUMBER: _ClassVar[int]
    RECENT_STEP_MS_FIELD_NUMBER: _ClassVar[int]
    NUM_LEASES_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PREFILL_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEP_MS_BASE_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEP_MS_PER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEP_MS_PER_KTOKEN_FIELD_NUMBER: _ClassVar[int]
    DECODE_STEP_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DECODE_ROWS_FIELD_NUMBER: _ClassVar[int]
    DECODE_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LORA_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    LOADED_LORAS_FIELD_NUMBER: _ClassVar[int]
    HOST_LOAD_SECONDS_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    DISK_LOAD_SECONDS_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_PER_ROW_STEP_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: Role
    timestamp_unix_ms: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    prefill_tokens_queued: int
    recent_step_ms: _containers.RepeatedScalarFieldContainer[float]
    num_leases: int
    draining: bool
    block_size: int
    model: str
    prefill_tokens_per_s: float
    max_model_len: int
    decode_step_ms_base: float
    decode_step_ms_per_sequence: float
    decode_step_ms_per_ktoken: float
    decode_step_samples: int
    decode_rows: int
    decode_context_tokens: int
    lora_adapters: _containers.RepeatedScalarFieldContainer[str]
    loaded_loras: _containers.RepeatedScalarFieldContainer[str]
    host_load_seconds_per_block: float
    disk_load_seconds_per_block: float
    decode_tokens_per_row_step: float
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[_Union[Role, str]] = ..., timestamp_unix_ms: _Optional[int] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_blocks_used: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., prefill_tokens_queued: _Optional[int] = ..., recent_step_ms: _Optional[_Iterable[float]] = ..., num_leases: _Optional[int] = ..., draining: _Optional[bool] = ..., block_size: _Optional[int] = ..., model: _Optional[str] = ..., prefill_tokens_per_s: _Optional[float] = ..., max_model_len: _Optional[int] = ..., decode_step_ms_base: _Optional[float] = ..., decode_step_ms_per_sequence: _Optional[float] = ..., decode_step_ms_per_ktoken: _Optional[float] = ..., decode_step_samples: _Optional[int] = ..., decode_rows: _Optional[int] = ..., decode_context_tokens: _Optional[int] = ..., lora_adapters: _Optional[_Iterable[str]] = ..., loaded_loras: _Optional[_Iterable[str]] = ..., host_load_seconds_per_block: _Optional[float] = ..., disk_load_seconds_per_block: _Optional[float] = ..., decode_tokens_per_row_step: _Optional[float] = ...) -> None: ...

class StreamKVEventsRequest(_message.Message):
    __slots__ = ("after_sequence",)
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    after_sequence: int
    def __init__(self, after_sequence: _Optional[int] = ...) -> None: ...

class KVEvent(_message.Message):
    __slots__ = ("sequence", "kind", "block_hashes", "medium")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[KVEvent.Kind]
        KIND_STORED: _ClassVar[KVEvent.Kind]
        KIND_REMOVED: _ClassVar[KVEvent.Kind]
        KIND_CLEARED: _ClassVar[KVEvent.Kind]
    KIND_UNSPECIFIED: KVEvent.Kind
    KIND_STORED: KVEvent.Kind
    KIND_REMOVED: KVEvent.Kind
    KIND_CLEARED: KVEvent.Kind
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    kind: KVEvent.Kind
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    medium: KVMedium
    def __init__(self, sequence: _Optional[int] = ..., kind: _Optional[_Union[KVEvent.Kind, str]] = ..., block_hashes: _Optional[_Iterable[int]] = ..., medium: _Optional[_Union[KVMedium, str]] = ...) -> None: ...

class KVEventBatch(_message.Message):
    __slots__ = ("worker_id", "events", "gap")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    GAP_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    events: _containers.RepeatedCompositeFieldContainer[KVEvent]
    gap: bool
    def __init__(self, worker_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[KVEvent, _Mapping]]] = ..., gap: _Optional[bool] = ...) -> None: ...

class GetKVSnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KVSnapshot(_message.Message):
    __slots__ = ("worker_id", "sequence", "block_hashes", "block_size", "host_block_hashes", "disk_block_hashes")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    HOST_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    DISK_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    sequence: int
    block_hashes: _containers.RepeatedScalarFieldContainer[int]
    block_size: int
    host_block_hashes: _containers.RepeatedScalarFieldContainer[int]
    disk_block_hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, worker_id: _Optional[str] = ..., sequence: _Optional[int] = ..., block_hashes: _Optional[_Iterable[int]] = ..., block_size: _Optional[int] = ..., host_block_hashes: _Optional[_Iterable[int]] = ..., disk_block_hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class LoadLoRAAdapterRequest(_message.Message):
    __slots__ = ("lora_name", "lora_path")
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    LORA_PATH_FIELD_NUMBER: _ClassVar[int]
    lora_name: str
    lora_path: str
    def __init__(self, lora_name: _Optional[str] = ..., lora_path: _Optional[str] = ...) -> None: ...

class LoadLoRAAdapterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UnloadLoRAAdapterRequest(_message.Message):
    __slots__ = ("lora_name",)
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    lora_name: str
    def __init__(self, lora_name: _Optional[str] = ...) -> None: ...

class UnloadLoRAAdapterResponse(_message.Message):
    __slots__ = ("finishing_requests",)
    FINISHING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    finishing_requests: int
    def __init__(self, finishing_requests: _Optional[int] = ...) -> None: ...
