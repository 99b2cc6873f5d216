"""The `baton` command. Each subcommand lives in its own module with `register(subparsers)`."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Each subcommand, its module (which defines register(subparsers) and sets a `func` default) and
# its line in `baton --help`, which imports none of them: some import torch and transformers,
# seconds that `baton --help` should not wait for (tests/test_cli_help.py keeps these lines equal
# to each module's own). Benchmarks and load generators drive the services from outside, so their
# commands live in baton.loadtest.
COMMANDS = {
    "serve": ("baton.services.cli.serve",
              "run the whole stack (workers, router, gateway) on this machine"),
    "worker": ("baton.services.cli.worker",
               "serve an engine over gRPC (prefill, decode or mixed role)"),
    "router": ("baton.services.cli.router",
               "serve prefix-aware placement and admission control over gRPC"),
    "gateway": ("baton.services.cli.gateway", "serve the OpenAI-compatible HTTP API"),
    "operator": ("baton.services.cli.operator", "run the Kubernetes operator"),
    "run_batch": ("baton.services.cli.run_batch", "run an OpenAI batch file (JSONL) offline"),
    "usage": ("baton.services.cli.usage", "report the usage records of the gateways' requests"),
    "make_tiny_model": ("baton.services.cli.make_tiny_model",
                        "write a tiny random Hugging Face checkpoint"),
    "bench": ("baton.loadtest.commands.bench", "benchmarks"),
    "loadtest": ("baton.loadtest.commands.loadtest", "load-test an OpenAI-compatible server"),
    "loadtest_compare": ("baton.loadtest.commands.loadtest_compare",
                         "compare load-test sweeps side by side"),
}
SUBCOMMAND_MODULES = {name: module for name, (module, _) in COMMANDS.items()}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser for `only` one subcommand (its module imported), or, with None, the top-level
    parser whose subcommands are their `baton --help` lines (nothing imported)."""
    parser = argparse.ArgumentParser(prog="baton", description="Baton: disaggregated LLM serving")
    parser.add_argument("--log-level", default="INFO", help="Python logging level")
    subparsers = parser.add_subparsers(dest="command", required=True)
    if only is not None:
        importlib.import_module(SUBCOMMAND_MODULES[only]).register(subparsers)
        return parser
    for name, (_, summary) in COMMANDS.items():
        subparsers.add_parser(name.replace("_", "-"), help=summary)
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
    from baton.services.cli.environment import warn_unknown_variables

    warn_unknown_variables()
    from pydantic import ValidationError

    try:
        return int(args.func(args) or 0)
    except ValidationError as e:
        # A setting's own check (a flag, a BATON_* variable or a config file): its message, not a
        # traceback.
        problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
                             for err in e.errors())
        print(f"baton {args.command}: error: {problems}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
