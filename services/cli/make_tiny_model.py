"""`baton make-tiny-model DIR`: write a tiny random Hugging Face checkpoint (for tests, demos and
benchmarks)."""
from __future__ import annotations

import argparse
import dataclasses
import sys

from transformers.utils import logging as hf_logging

from baton.services.checkpoints.tiny_model import (ARCHS, PRESETS, TinyModelSpec, count_parameters,
                                                   make_tiny_model)

# Every spec field but these gets an override flag, so new size knobs reach the CLI without edits
# here.
_NOT_SIZES = ("arch", "seed")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "make-tiny-model", help="write a tiny random Hugging Face checkpoint",
        description="Write a random checkpoint (config, safetensors weights, BPE tokenizer, ChatML "
                    "chat template) that transformers and baton load like any other model.")
    parser.add_argument("dir", help="output folder (created if missing)")
    parser.add_argument("--arch", choices=ARCHS, default="llama",
                        help="model architecture [default: llama]")
    parser.add_argument(
        "--preset", choices=tuple(PRESETS), default="tiny",
        help="sizes: tiny (~150K parameters, for tests) or bench (~30M) [default: tiny]")
    parser.add_argument("--seed", type=int, default=0,
                        help="weight seed; the same seed gives identical files")
    sizes = parser.add_argument_group("size overrides (default: the preset's)")
    for field in dataclasses.fields(TinyModelSpec):
        if field.name in _NOT_SIZES:
            continue
        flag = "--" + field.name.replace("_", "-")
        if field.type == "bool":
            sizes.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            sizes.add_argument(flag, type=float if field.type == "float" else int, default=None)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TinyModelSpec)
                 if f.name not in _NOT_SIZES and getattr(args, f.name) is not None}
    try:
        spec = TinyModelSpec.preset(args.arch, args.preset, seed=args.seed, **overrides)
    except ValueError as e:
        print(f"baton make-tiny-model: error: {e}", file=sys.stderr)
        return 2
    hf_logging.disable_progress_bar()  # the shard-writing bar is noise around a sub-second save
    path = make_tiny_model(args.dir, spec)
    print(path)
    print(f"{spec.arch}: {count_parameters(path):,} parameters")
    return 0
