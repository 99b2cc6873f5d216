"""The `baton` command. Each subcommand lives in its own module with `register(subparsers)`."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Each subcommand (the module name with '-' for '_') and its module, which defines
# register(subparsers) and sets a `func` default. Benchmarks and load generators drive the services
# from outside, so their commands live in baton.loadtest.
_SERVICE_COMMANDS = ("make_tiny_model", "run_batch", "worker", "operator", "router", "gateway",
                     "serve")
_LOAD_COMMANDS = ("bench", "loadtest", "loadtest_compare")
SUBCOMMAND_MODULES = {
    **{name: f"baton.services.cli.{name}" for name in _SERVICE_COMMANDS},
    **{name: f"baton.loadtest.commands.{name}" for name in _LOAD_COMMANDS},
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser for every subcommand, or for `only` one: some modules import torch and
    transformers, which a router or gateway process should not wait seconds for."""
    parser = argparse.ArgumentParser(prog="baton", description="Baton: disaggregated LLM serving")
    parser.add_argument("--log-level", default="INFO", help="Python logging level")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMAND_MODULES if only is None else (only,):
        importlib.import_module(SUBCOMMAND_MODULES[name]).register(subparsers)
    return parser


def _requested(argv: list[str]) -> str | None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--log-level")
    _, rest = pre.parse_known_args(argv)
    name = rest[0].replace("-", "_") if rest else None
    return name if name in SUBCOMMAND_MODULES else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(_requested(argv)).parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
