"""`baton router --port P [--workers host:port,...] [--config-file F] [--metrics-port M] [policy
flags]`: the placement and admission service over gRPC."""
from __future__ import annotations

import argparse
import asyncio

from baton.services.common.settings import add_settings_arguments, settings_from_args
from baton.services.router.config import RouterConfig
from baton.services.router.server import RouterServiceConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "router", help="serve prefix-aware placement and admission control over gRPC",
        description="Decide per request which prefill and decode workers to use, and whether to "
                    "admit it now, queue it or refuse it. Workers register with a heartbeat lease, "
                    "come from --workers, or from Kubernetes EndpointSlices. SIGTERM "
                    "stops it cleanly.")
    add_settings_arguments(parser, RouterServiceConfig)
    add_settings_arguments(parser, RouterConfig)
    parser.add_argument(
        "--config-file", dest="plugin_config_file", default=argparse.SUPPRESS,
        help="same as --plugin-config-file: plugin settings re-read when the file changes")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from baton.services.router.server import serve

    return asyncio.run(
        serve(settings_from_args(RouterServiceConfig, args), settings_from_args(RouterConfig,
                                                                                args)))
