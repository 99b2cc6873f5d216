"""Seeded request sets for benchmarks and load tests: lists of (prompt_token_ids, output_len).

The same arguments always give the same requests (numpy's PCG64 streams are stable across
platforms), so two systems, or two runs, are measured on identical work. Prompts are raw token ids
drawn from a pool that leaves out special tokens: a stray EOS or chat-control id would make a prompt
mean something else to the model.
"""
from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Iterator
from itertools import islice
from pathlib import Path

import numpy as np

from baton.loadtest.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest, iter_trace

log = logging.getLogger(__name__)

Request = tuple[list[int], int]  # (prompt_token_ids, output_len)
# Many tokenizers put their special tokens at the top of the vocabulary; the pool never reaches
# there.
RESERVED_TAIL = 16
# Offsets the stream of the shared prefix from the suffixes', so changing n does not change the
# prefix.
_PREFIX_STREAM = 1


def token_pool(vocab_size: int, avoid: Collection[int] = ()) -> np.ndarray:
    """Ids prompts are drawn from: [0, vocab_size - RESERVED_TAIL) less the given special ids."""
    ids = np.arange(max(0, vocab_size - RESERVED_TAIL))
    pool = ids[~np.isin(ids, np.fromiter(avoid, dtype=np.int64))]
    if pool.size == 0:
        raise ValueError(f"no usable token ids in a vocabulary of {vocab_size}")
    return pool


def _ratios(range_ratio: float | tuple[float, float]) -> tuple[float, float]:
    ratios = (range_ratio, range_ratio) if isinstance(range_ratio,
                                                      (int, float)) else tuple(range_ratio)
    if len(ratios) != 2 or not all(0.0 <= r < 1.0 for r in ratios):
        raise ValueError(f"range_ratio must be one or two values in [0, 1), not {range_ratio!r}")
    return ratios


def _lengths(rng: np.random.Generator, n: int, mean: int, ratio: float) -> np.ndarray:
    """Uniform integers in [mean*(1-r), mean*(1+r)], as vLLM's random dataset draws them (bounds
    rounded)."""
    if mean < 1:
        raise ValueError(f"lengths must be at least 1, not {mean}")
    low, high = max(1, round(mean * (1 - ratio))), max(1, round(mean * (1 + ratio)))
    return rng.integers(low, high + 1, size=n)


def _tokens(rng: np.random.Generator, pool: np.ndarray, length: int) -> list[int]:
    return pool[rng.integers(0, pool.size, size=length)].tolist()


def random_workload(n: int, input_len: int, output_len: int,
                    range_ratio: float | tuple[float, float] = 0.0, vocab_size: int = 32000,
                    seed: int = 0, avoid: Collection[int] = ()) -> list[Request]:
    """n prompts of random tokens. range_ratio is one ratio for both lengths, or (input ratio,
    output ratio)."""
    in_ratio, out_ratio = _ratios(range_ratio)
    rng = np.random.default_rng(seed)
    pool = token_pool(vocab_size, avoid)
    in_lens = _lengths(rng, n, input_len, in_ratio)
    out_lens = _lengths(rng, n, output_len, out_ratio)
    return [(_tokens(rng, pool, int(i)), int(o)) for i, o in zip(in_lens, out_lens)]


def shared_prefix_workload(n: int, prefix_len: int, suffix_len: int, output_len: int,
                           range_ratio: float | tuple[float, float] = 0.0, vocab_size: int = 32000,
                           seed: int = 0, avoid: Collection[int] = ()) -> list[Request]:
    """One prefix of prefix_len random tokens (a system prompt, say) before each of
    random_workload's prompts."""
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be non-negative, not {prefix_len}")
    prefix = _tokens(np.random.default_rng([seed, _PREFIX_STREAM]), token_pool(vocab_size, avoid),
                     prefix_len)
    return [(prefix + prompt, out) for prompt, out in
            random_workload(n, suffix_len, output_len, range_ratio, vocab_size, seed, avoid)]


def _scaled(length: int, scale: float) -> int:
    return max(1, round(length / scale))


class MooncakeBlocks:
    """Maps each Mooncake hash id to a fixed pseudo-random block of token ids, so that requests
    sharing their first k hash ids share exactly their first k blocks of tokens."""

    def __init__(self, block_len: int, pool: np.ndarray, seed: int = 0) -> None:
        self.block_len = block_len
        self.pool = pool
        self.seed = seed
        self._blocks: dict[int, list[int]] = {}

    def block(self, hash_id: int) -> list[int]:
        if hash_id not in self._blocks:
            # One stream per hash id: a block's tokens depend on nothing but the seed and its id.
            self._blocks[hash_id] = _tokens(np.random.default_rng([self.seed, hash_id]), self.pool,
                                            self.block_len)
        return self._blocks[hash_id]

    def prompt(self, hash_ids: Iterable[int], length: int) -> list[int]:
        """The first `length` tokens of the blocks' concatenation (the last block is usually
        partial)."""
        tokens: list[int] = []
        for hash_id in hash_ids:
            if len(tokens) >= length:
                break
            tokens += self.block(hash_id)
        return tokens[:length]


def _block_len(scale: float) -> int:
    block_len = MOONCAKE_BLOCK_TOKENS / scale
    if block_len < 1 or block_len != int(block_len):
        raise ValueError(
            f"Mooncake traces need a scale that divides {MOONCAKE_BLOCK_TOKENS}, not {scale}")
    return int(block_len)


def scaled_trace(rows: Iterable[TraceRequest], scale: float, pool: np.ndarray, seed: int = 0,
                 max_len: int | None = None) -> Iterator[tuple[TraceRequest, Request]]:
    """Each row that fits max_len (prompt plus output, after scaling) with its request, every length
    divided by scale; the row comes along for its arrival time. Rows with hash ids (Mooncake) get
    block-structured prompts, 512/scale tokens per hash id; others random ones. Lazy, so a load test
    reads only the rows it replays."""
    rng = np.random.default_rng(seed)
    blocks: MooncakeBlocks | None = None
    for row in rows:
        in_len, out_len = _scaled(row.input_len, scale), _scaled(row.output_len, scale)
        if row.hash_ids:
            blocks = blocks or MooncakeBlocks(_block_len(scale), pool, seed)
            in_len = min(in_len, len(row.hash_ids) * blocks.block_len)
        if max_len is not None and in_len + out_len > max_len:
            continue
        prompt = blocks.prompt(row.hash_ids, in_len) if row.hash_ids and blocks else _tokens(
            rng, pool, in_len)
        yield row, (prompt, out_len)


def trace_requests(rows: Iterable[TraceRequest], n: int, scale: float, pool: np.ndarray,
                   seed: int = 0, max_len: int | None = None) -> list[Request]:
    """The first n requests of scaled_trace: rows too long after scaling are left out."""
    counted = _Counted(rows)
    out = [request for _, request in islice(scaled_trace(counted, scale, pool, seed, max_len), n)]
    skipped = counted.seen - len(out)
    if len(out) < n:
        raise ValueError(
            f"the trace has only {len(out)} requests that fit (asked for {n}; {skipped} too long)")
    if skipped:
        log.info("skipped %d trace requests longer than %d tokens after scaling", skipped, max_len)
    return out


class _Counted:
    """An iterable that counts the rows drawn from it, to report how many were skipped."""

    def __init__(self, rows: Iterable[TraceRequest]) -> None:
        self.rows = rows
        self.seen = 0

    def __iter__(self) -> Iterator[TraceRequest]:
        for row in self.rows:
            self.seen += 1
            yield row


def trace_workload(name: str, n: int, scale: float, vocab_size: int, seed: int = 0,
                   avoid: Collection[int] = (), max_len: int | None = None,
                   traces_dir: str | Path | None = None) -> list[Request]:
    """The first n requests of a public trace (see loadtest.traces.TRACE_FILES), lengths divided by
    `scale`: state the scale beside any figure, since the traces' lengths are far beyond what a CPU
    serves."""
    if scale <= 0:
        raise ValueError(f"scale must be positive, not {scale}")
    return trace_requests(iter_trace(name, traces_dir), n, scale, token_pool(vocab_size, avoid),
                          seed, max_len)


def summarize(requests: list[Request]) -> dict[str, int | float]:
    """Length statistics, for reports: a figure means little without the shape of the work behind
    it."""
    ins = np.array([len(p) for p, _ in requests])
    outs = np.array([o for _, o in requests])
    return {
        "num_requests": len(requests), "prompt_tokens": int(ins.sum()),
        "output_tokens": int(outs.sum()), "input_len_min": int(ins.min()),
        "input_len_mean": round(float(ins.mean()), 1), "input_len_max": int(ins.max()),
        "output_len_min": int(outs.min()), "output_len_mean": round(float(outs.mean()), 1),
        "output_len_max": int(outs.max())
    }
