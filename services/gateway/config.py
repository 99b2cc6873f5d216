"""The gateway's one typed configuration (flags: `--port`, env: `BATON_PORT`, ...)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from baton.services.common.settings import BatonSettings


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
    max_model_len: int | None = Field(None, ge=1,
                                      description="Context length (default: the model's)")
    max_logprobs: int = Field(20, ge=0, description="Most top logprobs a request may ask for")
    api_keys_file: str | None = Field(
        None,
        description="YAML/JSON file of tenants and their API keys (a Kubernetes Secret "
                    "in a cluster)"
    )
    auth: bool = Field(True,
                       description="Require an API key; off serves everyone as the default tenant")
    default_requests_per_minute: int | None = Field(
        None, ge=1, description="Request rate limit of the default tenant (unset: none)")
    default_tokens_per_minute: int | None = Field(
        None, ge=1,
        description="Token rate limit (prompt + max_tokens) of the default tenant (unset: none)")
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
    slos: str = Field(
        "0=2000/100", description="Latency targets per priority, 'PRIORITY=TTFT_MS/TPOT_MS,...'; a "
                                  "priority without one uses the nearest lower priority's")

    @field_validator("slos")
    @classmethod
    def _valid_slos(cls, value: str) -> str:
        parse_slos(value)
        return value
