"""Readers for the public request traces under `shared/traces` (Azure LLM inference 2023, Mooncake
FAST'25).

The traces are data kept beside the repository, not in it: `<repo>/../shared/traces` unless
`BATON_TRACES_DIR` (or an explicit folder) says otherwise.
"""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterator

TRACES_DIR_ENV = "BATON_TRACES_DIR"
TRACE_FILES: dict[str, str] = {
    "azure-conv": "azure2023_conversation.csv",
    "azure-code": "azure2023_code.csv",
    "mooncake-conv": "mooncake_conversation.jsonl",
    "mooncake-synthetic": "mooncake_synthetic.jsonl",
}
# Mooncake hash ids each stand for one block of this many prompt tokens.
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float  # seconds since the trace's start
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()  # Mooncake only: chained hashes of the prompt's 512-token blocks


def default_traces_dir() -> Path:
    if os.environ.get(TRACES_DIR_ENV):
        return Path(os.environ[TRACES_DIR_ENV])
    # loadtest/ sits at the repository root, so parents[1] is the root whatever the working
    # directory.
    return Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def trace_path(name: str, traces_dir: str | Path | None = None) -> Path:
    if name not in TRACE_FILES:
        raise ValueError(f"trace must be one of {tuple(TRACE_FILES)}, not {name!r}")
    path = Path(traces_dir or default_traces_dir()) / TRACE_FILES[name]
    if not path.is_file():
        raise FileNotFoundError(
            f"trace file {path} not found; point --traces-dir or ${TRACES_DIR_ENV} at the traces")
    return path


def _azure_rows(path: Path) -> Iterator[TraceRequest]:
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            yield TraceRequest(float(row["arrived_at"]), int(row["num_prefill_tokens"]),
                               int(row["num_decode_tokens"]))


def _mooncake_rows(path: Path) -> Iterator[TraceRequest]:
    with path.open() as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                yield TraceRequest(row["timestamp"] / 1000.0, row["input_length"],
                                   row["output_length"], tuple(row["hash_ids"]))


def iter_trace(name: str, traces_dir: str | Path | None = None) -> Iterator[TraceRequest]:
    """The trace's requests in arrival order, read lazily so callers can stop early."""
    path = trace_path(name, traces_dir)
    return _mooncake_rows(path) if path.suffix == ".jsonl" else _azure_rows(path)


def read_trace(name: str, traces_dir: str | Path | None = None,
               limit: int | None = None) -> list[TraceRequest]:
    return list(islice(iter_trace(name, traces_dir), limit))
