"""The gateway's state, built once at start (services/gateway/server.py:build_gateway) and shared by
its routes: configuration, tokenizer, model, the orchestrator, keys, metrics, rate limits,
readiness, and the state store with the usage meter writing to it."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from transformers import PreTrainedTokenizerBase

from baton.services.gateway.config import GatewayConfig
from baton.services.gateway.metrics import GatewayMetrics
from baton.services.gateway.orchestrator import Orchestrator
from baton.services.gateway.rate_limits.limiter import RateLimiter
from baton.services.gateway.readiness import RouterHealth
from baton.services.gateway.tenants import DEFAULT_TENANT, KeyStore, Tenant
from baton.services.gateway.usage_meter import UsageMeter
from baton.services.openai.tool_parsers import ToolParser
from baton.services.state.store import StateStore


@dataclass
class Gateway:
    config: GatewayConfig
    tokenizer: PreTrainedTokenizerBase
    model_name: str
    max_model_len: int
    orchestrator: Orchestrator
    keys: KeyStore | None
    metrics: GatewayMetrics
    registry: CollectorRegistry
    limiter: RateLimiter
    # the model family's tool-call format, for auto tool_choice
    tool_parser: ToolParser | None = None
    draining: bool = False
    # the LoRA adapters the workers serve (through the router's GetStats): names `model` may give
    lora_adapters: frozenset[str] = frozenset()
    # runtime loads (True) and unloads (False) the router's reports do not show yet, and since when
    # (services/gateway/lora_updates.py)
    lora_pending: dict[str, tuple[bool, float]] = field(default_factory=dict)
    vocab_size: int | None = None  # the model's: logit_bias ids must fall in it
    router_health: RouterHealth | None = None
    # stored responses and usage records (services/state)
    store: StateStore | None = None
    meter: UsageMeter | None = None
    response_ttl_s: float | None = None  # how long stored responses are kept (None: ever)
    # renders chat templates and tokenizes, so a long prompt does not stall the event loop
    tokenize_pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.tokenize_pool = ThreadPoolExecutor(self.config.tokenizer_threads,
                                                thread_name_prefix="tokenize")

    def default_tenant(self) -> Tenant:
        config = self.config
        return Tenant(DEFAULT_TENANT, requests_per_minute=config.default_requests_per_minute,
                      tokens_per_minute=config.default_tokens_per_minute,
                      min_priority=config.default_min_priority,
                      max_priority=config.default_max_priority)

    def not_ready(self) -> str | None:
        """Why /ready answers 503, or None when ready."""
        if self.draining:
            return "gateway is draining"
        return self.router_health.problem if self.router_health is not None else None
