"""The gateway's state, built once at start (services/gateway/server.py:build_gateway) and shared by
its routes: configuration, the models with their tokenizers, the orchestrator, keys, metrics, rate
limits, readiness, and the state store with the usage meter writing to it."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from baton.services.gateway.config import GatewayConfig
from baton.services.gateway.lora_reconcile import LoRAReconciler
from baton.services.gateway.lora_record import LoRARecord
from baton.services.gateway.metrics import GatewayMetrics
from baton.services.gateway.orchestrator import Orchestrator
from baton.services.gateway.rate_limits.limiter import RateLimiter
from baton.services.gateway.readiness import RouterHealth
from baton.services.gateway.served_model import ServedModel
from baton.services.gateway.tenants import DEFAULT_TENANT, KeyStore, Tenant
from baton.services.gateway.usage_meter import UsageMeter
from baton.services.openai.errors import ProtocolError
from baton.services.state.store import StateStore


@dataclass
class Gateway:
    config: GatewayConfig
    # the base models it serves by name, --model's first (requests that name none run on it)
    models: dict[str, ServedModel]
    orchestrator: Orchestrator
    keys: KeyStore | None
    metrics: GatewayMetrics
    registry: CollectorRegistry
    limiter: RateLimiter
    draining: bool = False
    router_health: RouterHealth | None = None
    # stored responses and usage records (services/state)
    store: StateStore | None = None
    meter: UsageMeter | None = None
    response_ttl_s: float | None = None  # how long stored responses are kept (None: ever)
    # re-asserts the runtime LoRA adapters to the router (with --allow-runtime-lora-updating)
    lora_reconciler: LoRAReconciler | None = None
    # renders chat templates and tokenizes, so a long prompt does not stall the event loop
    tokenize_pool: ThreadPoolExecutor = field(init=False)
    # the runtime LoRA adapters loaded (services/gateway/lora_record.py): in the store, if any
    lora_record: LoRARecord = field(init=False)

    def __post_init__(self) -> None:
        self.tokenize_pool = ThreadPoolExecutor(self.config.tokenizer_threads,
                                                thread_name_prefix="tokenize")
        self.lora_record = LoRARecord(self.store, self.metrics.state_store_failures)
        if self.config.allow_runtime_lora_updating:
            self.lora_reconciler = LoRAReconciler(self.lora_record, self.orchestrator.channel,
                                                  self.config.lora_reconcile_interval_s)

    @property
    def default_model(self) -> ServedModel:
        """The model of requests that name none (--model's)."""
        return next(iter(self.models.values()))

    def resolve(self, model: str | None) -> tuple[ServedModel, str | None]:
        """The base model a request's `model` runs on, and the LoRA adapter it names (None: the
        base model itself); ProtocolError (404) for a name no base model or adapter has."""
        if model is None:
            return self.default_model, None
        if model in self.models:
            return self.models[model], None
        for served in self.models.values():
            if model in served.lora_adapters:
                return served, model
        raise ProtocolError(f"The model `{model}` does not exist; this server serves "
                            f"{', '.join(f'`{m}`' for m in self.served_names())}", param="model",
                            code="model_not_found", status=404)

    def served_names(self) -> list[str]:
        """Every name `model` may give: the base models, then each one's adapters."""
        return [*self.models, *(a for m in self.models.values() for a in sorted(m.lora_adapters))]

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
