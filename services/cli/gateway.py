"""`baton gateway --port 8000 --router ADDR --model DIR`: the OpenAI-compatible HTTP front door."""
from __future__ import annotations

import argparse
import asyncio
import sys

from baton.services.common.settings import add_settings_arguments, settings_from_args
from baton.services.gateway.config import GatewayConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "gateway", help="serve the OpenAI-compatible HTTP API",
        description="Serve /v1/completions, /v1/chat/completions and /v1/models, placing each "
                    "request through the router onto the workers.")
    add_settings_arguments(parser, GatewayConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # FastAPI and the tokenizer load only when it runs
    from baton.services.gateway.server import serve

    try:
        config = settings_from_args(GatewayConfig, args)
        return asyncio.run(serve(config))
    except ValueError as e:
        print(f"baton gateway: error: {e}", file=sys.stderr)
        return 2
