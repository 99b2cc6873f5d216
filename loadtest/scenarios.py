"""The load test's workloads, as endless (or trace-long) streams of requests drawn from a seed.

- synthetic: long-tailed (lognormal) prompt and output lengths, as production traffic has: most
  requests short, a few very long ones that interfere with everything else;
- shared-prefix: a few system prompts, each shared by many requests (what prefix caching and routing
  are for);
- multi-turn: conversations whose every turn resends the whole history plus a new user message;
- the public traces (loadtest.traces.TRACE_FILES): their lengths divided by `length_scale`, their
  arrival times kept.
"""
from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from baton.loadtest.traces import TRACE_FILES, iter_trace
from baton.loadtest.workloads import scaled_trace, token_pool

SYNTHETIC = ("synthetic", "shared-prefix", "multi-turn")
WORKLOADS = SYNTHETIC + tuple(TRACE_FILES)
# Lognormal sigma of the synthetic lengths: p99 is about 10x the median, near the Azure conversation
# trace's spread.
LENGTH_SIGMA = 1.0


@dataclass(frozen=True)
class LoadRequest:
    prompt: list[int]
    output_len: int
    session: int | None = None  # multi-turn: turns of one session are sent one after another
    trace_s: float | None = None  # trace replay: arrival time in the trace


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    vocab_size: int
    input_len: int = 128  # synthetic: median prompt (user message) length
    output_len: int = 64  # synthetic: median output length
    prefix_len: int = 256  # shared-prefix: system prompt length
    num_prefixes: int = 4  # shared-prefix: distinct system prompts
    sessions: int = 8  # multi-turn: conversations in progress at once
    turns: int = 4  # multi-turn: most turns per conversation
    length_scale: float = 16.0  # traces: every length divided by this (Mooncake: must divide 512)
    max_len: int = 2048  # prompt plus output never exceeds this (the server's context)
    seed: int = 0
    avoid: Collection[int] = ()
    traces_dir: str | Path | None = None


def _long_tailed(rng: np.random.Generator, median: int, cap: int) -> int:
    return int(min(cap, max(1, round(rng.lognormal(np.log(median), LENGTH_SIGMA)))))


def _synthetic(spec: WorkloadSpec, rng: np.random.Generator,
               pool: np.ndarray) -> Iterator[LoadRequest]:
    while True:
        out_len = _long_tailed(rng, spec.output_len, spec.max_len // 2)
        in_len = _long_tailed(rng, spec.input_len, spec.max_len - out_len)
        yield LoadRequest(pool[rng.integers(0, pool.size, in_len)].tolist(), out_len)


def _shared_prefix(spec: WorkloadSpec, rng: np.random.Generator,
                   pool: np.ndarray) -> Iterator[LoadRequest]:
    prefixes = [
        pool[rng.integers(0, pool.size, spec.prefix_len)].tolist() for _ in range(spec.num_prefixes)
    ]
    room = spec.max_len - spec.prefix_len
    if room < 2:
        raise ValueError(f"prefix_len {spec.prefix_len} leaves no room in max_len {spec.max_len}")
    # Zipf-like popularity: the first system prompt is the most used, as with a few dominant
    # applications.
    weights = 1.0 / np.arange(1, spec.num_prefixes + 1)
    weights /= weights.sum()
    for request in _synthetic(WorkloadSpec(**{**spec.__dict__, "max_len": room}), rng, pool):
        prefix = prefixes[int(rng.choice(spec.num_prefixes, p=weights))]
        yield LoadRequest(prefix + request.prompt, request.output_len)


def _multi_turn(spec: WorkloadSpec, rng: np.random.Generator,
                pool: np.ndarray) -> Iterator[LoadRequest]:
    """Each request is the next turn of a random open session. The assistant's part of the history
    is a fixed stand-in of output_len tokens (not the server's answer), so every run sends the same
    prompts."""
    histories: dict[int, tuple[list[int], int]] = {}  # session -> (history, turns sent)
    next_id = 0
    while True:
        while len(histories) < spec.sessions:
            histories[next_id] = ([], 0)
            next_id += 1
        session = list(histories)[int(rng.integers(len(histories)))]
        history, sent = histories[session]
        out_len = _long_tailed(rng, spec.output_len, spec.max_len // 4)
        user = pool[rng.integers(0, pool.size, _long_tailed(rng, spec.input_len,
                                                            spec.max_len // 4))].tolist()
        prompt = history + user
        if sent and len(prompt) + out_len > spec.max_len:
            # the conversation has outgrown the context: it ends, a new one starts
            del histories[session]
            continue
        yield LoadRequest(prompt[-(spec.max_len - out_len):], out_len, session=session)
        answer = pool[rng.integers(0, pool.size, out_len)].tolist()
        histories[session] = (prompt + answer, sent + 1)
        if sent + 1 >= spec.turns:
            del histories[session]


def _trace(spec: WorkloadSpec, pool: np.ndarray) -> Iterator[LoadRequest]:
    rows = iter_trace(spec.name, spec.traces_dir)
    for row, (prompt, out_len) in scaled_trace(rows, spec.length_scale, pool, spec.seed,
                                               spec.max_len):
        yield LoadRequest(prompt, out_len, trace_s=row.arrival_s)


def iter_requests(spec: WorkloadSpec) -> Iterator[LoadRequest]:
    """The workload's requests in send order; synthetic ones never end, trace ones end with the
    trace."""
    if spec.name not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, not {spec.name!r}")
    pool = token_pool(spec.vocab_size, spec.avoid)
    if spec.name in TRACE_FILES:
        return _trace(spec, pool)
    rng = np.random.default_rng(spec.seed)
    return {"synthetic": _synthetic, "shared-prefix": _shared_prefix,
            "multi-turn": _multi_turn}[spec.name](spec, rng, pool)
