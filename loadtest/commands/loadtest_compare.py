"""`baton loadtest-compare`: sweeps of several systems (each `baton loadtest --sweep ...
--output-json F`) side by side, as a Markdown table and, with --plots, one figure of goodput, TTFT
p90 and ITL p99 against offered rate."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("loadtest-compare", help="compare load-test sweeps side by side",
                              description=__doc__)
    p.add_argument("runs", nargs="+", metavar="LABEL=FILE",
                   help="a system's name and its sweep's JSON")
    p.add_argument("--plots", default=None, metavar="DIR", help="write comparison.png into DIR")
    p.set_defaults(func=run)


def _load(spec: str) -> tuple[str, dict]:
    label, sep, path = spec.partition("=")
    if not sep or not label or not path:
        raise SystemExit(f"expected LABEL=FILE, got {spec!r}")
    data = json.loads(Path(path).read_text())
    if "points" not in data:
        raise SystemExit(
            f"{path} holds no sweep (run `baton loadtest --sweep ... --output-json {path}`)")
    return label, data


def run(args: argparse.Namespace) -> int:
    from baton.loadtest.report import comparison_table, plot_comparison

    runs = dict(_load(spec) for spec in args.runs)
    print(comparison_table(runs))
    if args.plots:
        print(f"plot: {plot_comparison(runs, args.plots)}")
    return 0
