"""`baton serve`'s settings: its own (ServeConfig), and the engine's and the gateway's with their
own flags, which are vLLM's names (`baton serve DIR --max-model-len 4096 --max-num-seqs 128
--gpu-memory-utilization 0.8 --served-model-name NAME`). Each comes from a flag, else its BATON_*
variable, else `--config FILE` (YAML, the same keys), else its default; serve then passes each to
the processes that read it. Flags for fields a settings class gains appear here without a change.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field, ValidationError

from baton.services.cli.config_file import load_config_file, settings_with_file
from baton.services.cli.serve_models import add_model_arguments, take_models
from baton.services.common.settings import (BatonSettings, add_settings_arguments,
                                            describe_error)
from baton.services.engine.config import EngineConfig
from baton.services.gateway.config import GatewayConfig


class ServeConfig(BatonSettings):
    """What only `baton serve` decides: the shape of the stack and how it is kept up."""
    mode: Literal["disaggregated", "colocated"] = Field(
        "disaggregated",
        description="disaggregated: prefill workers hand their KV to decode workers; colocated: "
                    "mixed workers, each serving both phases")
    prefill_workers: int = Field(1, ge=1, description="Prefill workers (disaggregated mode)")
    decode_workers: int = Field(1, ge=1,
                                description="Decode workers (colocated mode: mixed workers)")
    kv_transport: Literal["nixl", "grpc", "cuda_ipc"] = Field(
        "nixl",
        description="How decode workers read prefill KV; cuda_ipc: GPU caches on this node, "
                    "without UCX")
    prefill_memory_share: float | None = Field(
        None,
        description="Disaggregated: the prefill workers' part of --gpu-memory-utilization, "
                    "strictly between 0 and 1 (default: their share of the worker count)")
    max_restarts: int = Field(
        5, ge=0,
        description="Deaths of one service within --restart-window-s that are still restarted; one "
                    "more stops the stack")
    restart_window_s: float = Field(120.0, gt=0,
                                    description="The window --max-restarts counts in")
    restart_backoff_s: float = Field(
        1.0, gt=0,
        description="Delay before restarting a service that died; doubles while it keeps dying, up "
                    "to 30 s")


# Gateway settings that serve sets per process rather than taking as flags: the router's address,
# the gateway's metrics port (--gateway-arg=--metrics-port=P gives it one), and the further models
# (serve gives the gateway each repeated --model).
GATEWAY_EXCLUDED = ("router", "metrics_port", "additional_models")
# Extra arguments passed through as they are, each repeatable: (option, who gets it).
PASS_THROUGH = {
    "worker_arg": "every worker, e.g. --worker-arg=--num-kv-blocks=512",
    "prefill_worker_arg": "prefill workers, after --worker-arg (so it wins)",
    "decode_worker_arg": "decode workers (colocated: the mixed workers), after --worker-arg",
    "router_arg": "the router, e.g. --router-arg=--queue-max-size=0",
    "gateway_arg": "the gateway, e.g. --gateway-arg=--metrics-port=9100",
}


def gateway_flags() -> list[str]:
    """The gateway's fields that are serve flags of the gateway's own (the rest are the engine's
    or serve's, or set per process)."""
    taken = set(ServeConfig.model_fields) | set(EngineConfig.model_fields)
    return [n for n in GatewayConfig.model_fields if n not in taken and n not in GATEWAY_EXCLUDED]


def serve_fields() -> set[str]:
    """Every settings field `baton serve` takes (a flag, a variable, a key of --config)."""
    return set(ServeConfig.model_fields) | set(EngineConfig.model_fields) | set(gateway_flags())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_path", nargs="?", default=None, metavar="MODEL",
                        help="checkpoint folder, as --model [default: the embedded tiny model]")
    parser.add_argument(
        "--config", dest="config_file", default=None, metavar="FILE",
        help="YAML file of settings, keyed by flag name (max-model-len: 4096); flags and BATON_* "
             "variables win over it")
    add_settings_arguments(parser, ServeConfig)
    add_model_arguments(parser.add_argument_group("the models (each repeatable)"))
    add_settings_arguments(parser, EngineConfig, exclude=("model", "served_model_name"))
    add_settings_arguments(parser, GatewayConfig,
                           exclude=tuple(set(GatewayConfig.model_fields) - set(gateway_flags())))
    group = parser.add_argument_group("passed through to the processes as they are (repeatable)")
    for name, whom in PASS_THROUGH.items():
        group.add_argument("--" + name.replace("_", "-"), dest=name, action="append", default=[],
                           metavar="ARG", help=f"an argument for {whom}")


@dataclass
class ServeSettings:
    serve: ServeConfig
    engine: EngineConfig
    gateway: GatewayConfig
    extra: dict[str, list[str]]  # PASS_THROUGH name -> its arguments, the file's first
    # the folders and names of the models after the first (--model repeated), in order
    more_models: list[str] = field(default_factory=list)
    more_names: list[str] = field(default_factory=list)

    @property
    def auth(self) -> bool:
        """A local stack serves without keys unless it is given a keys file (or --auth)."""
        if "auth" in self.gateway.model_fields_set:
            return self.gateway.auth
        return self.gateway.api_keys_file is not None


def _pass_through(args: argparse.Namespace, from_file: dict) -> dict[str, list[str]]:
    extra = {}
    for name in PASS_THROUGH:
        filed = from_file.get(name, [])
        filed = [filed] if isinstance(filed, str) else filed
        if not isinstance(filed, list) or not all(isinstance(a, str) for a in filed):
            raise ValueError(f"--config: {name.replace('_', '-')} must be a list of arguments")
        extra[name] = [*filed, *getattr(args, name)]
    return extra


def resolve(args: argparse.Namespace) -> ServeSettings:
    """The settings from the parsed command line, the environment and --config; ValueError, on one
    line, when any is invalid."""
    more_models, more_names = take_models(args)
    from_file = {}
    if args.config_file:
        from_file = load_config_file(args.config_file, serve_fields() | set(PASS_THROUGH))
    try:
        return ServeSettings(settings_with_file(ServeConfig, args, from_file),
                             settings_with_file(EngineConfig, args, from_file),
                             settings_with_file(GatewayConfig, args, from_file),
                             _pass_through(args, from_file), more_models, more_names)
    except ValidationError as e:
        raise ValueError(describe_error(e)) from None
