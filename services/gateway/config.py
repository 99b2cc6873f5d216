"""The gateway's one typed configuration (flags: `--port`, env: `BATON_PORT`, ...)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from baton.services.common.settings import BatonSettings
from baton.services.state.durations import parse_duration
from baton.services.state.urls import engine_url


@dataclass(frozen=True)
class SLO:
    ttft_ms: float
    tpot_ms: float


def parse_slos(spec: str) -> dict[int, SLO]:
    """'PRIORITY=TTFT_MS/TPOT_MS,...', e.g. '0=2000/100,-1=10000/500'."""
    slos = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        priority, _, targets = item.partition("=")
        ttft, _, tpot = targets.partition("/")
        try:
            slos[int(priority)] = SLO(float(ttft), float(tpot))
        except ValueError:
            raise ValueError(f"bad SLO entry {item!r}: expected PRIORITY=TTFT_MS/TPOT_MS") from None
    return slos


class GatewayConfig(BatonSettings):
    host: str = Field("127.0.0.1", description="Address the HTTP server listens on")
    port: int = Field(8000, ge=0, le=65535,
                      description="HTTP port (0: any free port, printed at start)")
    router: str = Field("127.0.0.1:50050", description="host:port of the router's gRPC service")
    model: str | None = Field(
        None, description="Checkpoint folder for the tokenizer and chat template (unset: the "
                          "embedded tiny model)")
    served_model_name: str | None = Field(
        None,
        description="Model name clients use; must match the workers' (default: the folder's name)")
    additional_models: list[str] = Field(
        [],
        description="Further base models behind this gateway, each NAME=PATH (the checkpoint "
                    "folder of its tokenizer and chat template); the router must route each NAME")
    max_model_len: int | None = Field(None, ge=1,
                                      description="Context length (default: the model's)")
    max_logprobs: int = Field(
        20, ge=-1,
        description="Most top logprobs a request may ask for (-1: no limit, so a request may ask "
                    "for the whole vocabulary with -1)")
    max_request_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024,
        description="Largest request body accepted; a larger one is refused with 413 before it is "
                    "read (by Content-Length, or as a chunked body's bytes arrive)")
    max_json_depth: int = Field(
        128, ge=8, le=512,
        description="Deepest nesting of arrays and objects a request body may have (400 beyond)")
    tokenizer_threads: int = Field(
        2, ge=1,
        description="Threads that render chat templates and tokenize prompts, off the event loop; "
                    "further requests wait for one")
    api_keys_file: str | None = Field(
        None,
        description="YAML/JSON file of tenants and their API keys (a Kubernetes Secret "
                    "in a cluster)"
    )
    auth: bool = Field(True,
                       description="Require an API key; off serves everyone as the default tenant")
    api_keys_poll_interval_s: float = Field(
        10.0, gt=0,
        description="How often the API-keys file is checked for changes (a Secret update); "
                    "SIGHUP reloads it at once")
    metrics_port: int | None = Field(
        None, ge=0, le=65535,
        description="Separate HTTP port for /metrics, /health and /ready, without a key (keep it "
                    "off the public Service); the API port then serves no /metrics (unset: "
                    "/metrics on the API port, behind a key when auth is on)")
    tenant_metrics_label: Literal["name", "hash", "off"] = Field(
        "name",
        description="The tenant label on per-tenant metrics: the tenant's 'name', a 'hash' (the "
                    "first 12 hex digits of its SHA-256) or 'off' (one series, tenant=\"all\")")
    router_check_interval_s: float = Field(
        2.0, gt=0,
        description="How often the router's gRPC health is checked (and the check's timeout); "
                    "/ready answers 503 while it fails")
    http_idle_timeout_s: float = Field(
        75.0, gt=0,
        description="Close a connection that has no request under way for this long (new, or "
                    "kept alive between requests; above the usual 60 s of proxies in front)")
    http_header_timeout_s: float = Field(
        10.0, gt=0,
        description="Answer 408 and close when a request's head (request line and headers) has "
                    "not fully arrived this long after its first byte")
    http_body_timeout_s: float = Field(
        60.0, gt=0,
        description="Answer 408 and close when a request's body has not fully arrived this long "
                    "after its head")
    default_requests_per_minute: int | None = Field(
        None, ge=1, description="Request rate limit of the default tenant (unset: none)")
    default_tokens_per_minute: int | None = Field(
        None, ge=1,
        description="Token rate limit (prompt + max_tokens) of the default tenant (unset: none)")
    rate_limit_store: str | None = Field(
        None,
        description="Where the tenants' request and token buckets are kept: a Redis URL "
                    "(redis://[:password@]host:6379/0, rediss:// for TLS) shared by every gateway "
                    "replica, so together they hold each limit once (unset: in this process, "
                    "right for one replica only)")
    rate_limit_fail: Literal["open", "closed"] = Field(
        "open",
        description="While the rate-limit store is unreachable: 'open' admits requests "
                    "unlimited, 'closed' refuses them with 503 (both counted in "
                    "baton_gateway_rate_limit_store_errors_total)")
    rate_limit_key_prefix: str = Field(
        "baton:ratelimit:", min_length=1,
        description="Prefix of the buckets' keys in the rate-limit store (gateways that share "
                    "limits share it)")
    rate_limit_store_timeout_s: float = Field(
        0.5, gt=0,
        description="How long a rate-limit store call may take before it counts as the store "
                    "being down")
    rate_limit_store_retry_after_s: float = Field(
        1.0, gt=0,
        description="After a rate-limit store call fails, how long the store is left alone (each "
                    "request meanwhile decided as --rate-limit-fail says, without the store's "
                    "timeout) before it is tried again; also the Retry-After of the 503s when "
                    "failing closed")
    rate_limit_output_estimate: int = Field(
        256, ge=1,
        description="Completion tokens reserved per choice of a request that sets no max_tokens "
                    "(fewer when the context has less room); every request is settled to what "
                    "it used when it ends")
    max_request_priority: int = Field(
        1000, ge=0, le=1_000_000,
        description="Largest magnitude of a request's `priority` (vLLM's meaning: lower is served "
                    "earlier); beyond it is a 400. Within it, the result is clamped to the "
                    "tenant's band (see the API keys file)")
    default_min_priority: int | None = Field(
        None, ge=-1_000_000_000, le=0,
        description="Lowest priority (higher is served first) the default tenant's requests may "
                    "ask for (unset: as low as --max-request-priority allows)")
    default_max_priority: int = Field(
        0, ge=0, le=1_000_000_000,
        description="Highest priority (higher is served first) the default tenant's requests may "
                    "ask for; its own is 0")
    max_migrations: int = Field(
        2, ge=0,
        description="How often a request may move to another decode worker after one "
                    "dies mid-stream"
    )
    prefill_timeout_s: float = Field(
        10.0, gt=0,
        description="How long a prefill worker may take to answer a request without a TTFT SLO; "
                    "past it the prompt is computed on the decode worker instead")
    prefill_timeout_slo_factor: float = Field(
        3.0, gt=0,
        description="For a request with a TTFT SLO, the prefill worker's deadline is this many "
                    "times the SLO")
    tool_call_parser: Literal["auto", "hermes", "llama3_json", "none"] = Field(
        "auto",
        description="How tool calls are read from outputs when tool_choice is auto: 'hermes' "
                    "(<tool_call>{...}</tool_call>, Qwen/Hermes), 'llama3_json' (Llama 3.x JSON), "
                    "'auto' (from the chat template and model family) or 'none' (never)")
    strict_request_fields: bool = Field(
        False,
        description="Refuse (400) request fields no OpenAI or vLLM request defines; off: they are "
                    "ignored with a warning in the log, as vLLM does")
    return_tokens_as_token_ids: bool = Field(
        False,
        description="Logprobs name tokens 'token_id:N' unless a request says otherwise (vLLM's "
                    "flag and request field)")
    allow_runtime_lora_updating: bool = Field(
        False,
        description="Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING) to admin keys (`admin: true` in the API "
                    "keys file); off, they answer 404")
    lora_reconcile_interval_s: float = Field(
        30.0, gt=0,
        description="How often the record of runtime LoRA adapters (in the state store) is read "
                    "and what the router lacks of it re-asserted; a router that restarts is also "
                    "caught up within --router-check-interval-s of its first stats")
    slos: str = Field(
        "0=2000/100", description="Latency targets per priority, 'PRIORITY=TTFT_MS/TPOT_MS,...'; a "
                                  "priority without one uses the nearest lower priority's")

    @field_validator("rate_limit_store")
    @classmethod
    def _valid_rate_limit_store(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("--rate-limit-store must be a redis://, rediss:// or unix:// URL")
        return value

    state_store: str = Field(
        "sqlite:///baton-state.db",
        description="Where stored responses and usage records live: sqlite:///PATH (a file; a "
                    "relative PATH is under the working directory) for one gateway, "
                    "postgresql://USER@HOST:PORT/DB shared by several replicas")
    state_store_timeout_s: float = Field(
        5.0, gt=0, description="How long connecting to a PostgreSQL state store may take before "
                               "the request that needs it is answered 503")
    response_ttl: str | None = Field(
        None, description="How long a stored response is kept, e.g. 30d or 12h (unset: until "
                          "deleted); expired ones are deleted in the background")
    usage_update_interval_s: float = Field(
        5.0, gt=0, description="How often the usage records of running requests are brought up "
                               "to date (and stale records and expired responses swept)")
    usage_stale_after_s: float = Field(
        120.0, gt=0,
        description="A usage record still in progress but not updated for this long belongs to a "
                    "gateway that died: it is settled 'failed' with what it had served")

    @field_validator("state_store")
    @classmethod
    def _valid_store(cls, value: str) -> str:
        engine_url(value)
        return value

    @field_validator("response_ttl")
    @classmethod
    def _valid_ttl(cls, value: str | None) -> str | None:
        if value is not None:
            parse_duration(value)
        return value

    @field_validator("slos")
    @classmethod
    def _valid_slos(cls, value: str) -> str:
        parse_slos(value)
        return value
