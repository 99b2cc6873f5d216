"""Speculative decoding against none, on the same engine settings and the same requests: TPOT and
output tokens/s at each batch size, on a workload whose outputs repeat their prompts (a passage
quoted and continued, as in code edits and summaries) and on one whose prompts never repeat.

Every request is greedy with EOS ignored, so both runs produce the same tokens (checked) and the
same count; they alternate, each point the median of its repeats, so that load on a shared machine
falls on both alike.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.llm_engine import LLMEngine

# Prompt tokens come from above the tokenizer's special and byte tokens.
FIRST_TOKEN = 300
WORKLOADS = ("repeat", "random")


@dataclass(frozen=True)
class Run:
    tpot_s: float  # mean over requests of (last token - first token) / (tokens - 1)
    tokens_per_s: float  # output tokens over the wall time of the batch
    tokens: list[list[int]]


@dataclass(frozen=True)
class SpecRow:
    workload: str
    batch: int
    tpot_ms_off: float
    tpot_ms_on: float
    tokens_per_s_off: float
    tokens_per_s_on: float
    acceptance: float | None  # accepted over drafted tokens in the runs with speculation
    drafts_per_request: float
    identical: bool

    @property
    def tpot_speedup(self) -> float:
        return self.tpot_ms_off / self.tpot_ms_on


def prompts(workload: str, batch: int, prompt_len: int, vocab: int, seed: int) -> list[list[int]]:
    """repeat: a random span, then copies of it up to prompt_len (the output continues the
    copying); random: prompt_len random tokens."""
    rng = random.Random(seed)
    out = []
    for _ in range(batch):
        if workload == "repeat":
            span = [rng.randrange(FIRST_TOKEN, vocab) for _ in range(rng.randint(12, 24))]
            out.append((span * (prompt_len // len(span) + 1))[:prompt_len])
        else:
            out.append([rng.randrange(FIRST_TOKEN, vocab) for _ in range(prompt_len)])
    return out


def timed(engine: LLMEngine, batch_prompts: list[list[int]], output_len: int) -> Run:
    """Runs the batch to completion, all requests added at once."""
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    ids = [f"spec-{time.monotonic_ns()}-{i}" for i in range(len(batch_prompts))]
    for rid, prompt in zip(ids, batch_prompts):
        engine.add_request(rid, prompt, params)
    first: dict[str, float] = {}
    done: dict[str, tuple[float, list[int]]] = {}
    started = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            now = time.perf_counter()
            first.setdefault(out.request_id, now)
            if out.finished:
                done[out.request_id] = (now, list(out.token_ids))
    wall = time.perf_counter() - started
    tpots = [(done[r][0] - first[r]) / max(1, len(done[r][1]) - 1) for r in ids]
    return Run(statistics.mean(tpots), sum(len(done[r][1]) for r in ids) / wall,
               [done[r][1] for r in ids])


def measure(off: LLMEngine, on: LLMEngine, workload: str, batch: int, prompt_len: int,
            output_len: int, repeats: int, seed: int) -> SpecRow:
    batch_prompts = prompts(workload, batch, prompt_len, off.model_config.vocab_size, seed)
    stats = on.speculator.stats
    drafted, accepted, drafts = stats.num_draft_tokens, stats.num_accepted_tokens, stats.num_drafts
    runs_off, runs_on = [], []
    for _ in range(repeats):
        runs_off.append(timed(off, batch_prompts, output_len))
        runs_on.append(timed(on, batch_prompts, output_len))
    drafted, accepted = stats.num_draft_tokens - drafted, stats.num_accepted_tokens - accepted
    return SpecRow(
        workload, batch,
        tpot_ms_off=1e3 * statistics.median(r.tpot_s for r in runs_off),
        tpot_ms_on=1e3 * statistics.median(r.tpot_s for r in runs_on),
        tokens_per_s_off=statistics.median(r.tokens_per_s for r in runs_off),
        tokens_per_s_on=statistics.median(r.tokens_per_s for r in runs_on),
        acceptance=accepted / drafted if drafted else None,
        drafts_per_request=(stats.num_drafts - drafts) / (repeats * batch),
        identical=all(a.tokens == b.tokens for a, b in zip(runs_off, runs_on)))


def format_rows(rows: list[SpecRow]) -> str:
    lines = ["workload  batch  TPOT ms off  TPOT ms on  speedup  tok/s off  tok/s on  "
             "accepted  drafts/req  identical"]
    for r in rows:
        acceptance = "-" if r.acceptance is None else f"{r.acceptance:.0%}"
        lines.append(
            f"{r.workload:<8}  {r.batch:>5}  {r.tpot_ms_off:>11.2f}  {r.tpot_ms_on:>10.2f}  "
            f"{r.tpot_speedup:>6.2f}x  {r.tokens_per_s_off:>9.1f}  {r.tokens_per_s_on:>8.1f}  "
            f"{acceptance:>8}  {r.drafts_per_request:>10.1f}  {'yes' if r.identical else 'NO':>9}")
    return "\n".join(lines)


def row_dict(row: SpecRow) -> dict:
    return {**asdict(row), "tpot_speedup": row.tpot_speedup}
