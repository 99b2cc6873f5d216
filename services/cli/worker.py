"""`baton worker --role prefill|decode|mixed --model DIR --port P [engine flags]`: one engine over
gRPC."""
from __future__ import annotations

import argparse
import asyncio

from baton.services.cli.engine_runner import sim_runner_for
from baton.services.common.settings import add_settings_arguments, settings_from_args
from baton.services.engine.config import EngineConfig
from baton.services.worker.config import WorkerConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "worker", help="serve an engine over gRPC (prefill, decode or mixed role)",
        description="Serve one engine over gRPC. Prefill workers hand KV blocks to decode workers "
                    "over NIXL (or gRPC); a mixed worker serves both phases. SIGTERM drains "
                    "in-flight work before exiting.")
    add_settings_arguments(parser, WorkerConfig)
    add_settings_arguments(parser, EngineConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from baton.services.worker.server import serve  # heavy imports only when the command runs

    from baton.services.engine.lora.modules import LoRAError
    from baton.services.engine.parallel.sharding import ShardingError
    from baton.services.engine.speculation.config import SpeculativeConfigError

    engine_config = settings_from_args(EngineConfig, args)
    worker_config = settings_from_args(WorkerConfig, args)
    if (engine_config.tensor_parallel_size > 1 and worker_config.role != "mixed"
            and worker_config.kv_transport != "nixl"):
        # Only NIXL reads each rank's heads from every rank's cache (kv_transfer/head_transport).
        raise SystemExit(f"baton worker: --role {worker_config.role} at --tensor-parallel-size > 1 "
                         f"hands KV off over --kv-transport nixl only, not "
                         f"{worker_config.kv_transport}")
    try:
        return asyncio.run(serve(worker_config, engine_config, sim_runner_for(engine_config)))
    except (ShardingError, LoRAError, SpeculativeConfigError) as e:
        # A model it cannot split, an adapter it cannot take, a draft or EAGLE head that cannot
        # serve it: found while the engine loads, before anything listens.
        raise SystemExit(f"baton worker: {e}") from None
