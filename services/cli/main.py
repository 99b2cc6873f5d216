"""The `baton` command. Each subcommand lives in its own module with `register(subparsers)`."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Module names under baton.services.cli; each defines register(subparsers) and sets a `func` default.
SUBCOMMAND_MODULES = ("make_tiny_model", "run_batch", "bench", "worker", "operator", "router", "gateway", "serve")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baton", description="Baton: disaggregated LLM serving")
    parser.add_argument("--log-level", default="INFO", help="Python logging level")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"baton.services.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
