"""Tensor parallelism's cost and gain per step: prefill and pure decode step times at each
tensor-parallel size, tokens per second, and the share of rank 0's step spent in the model's
collectives (the all-reduces after o_proj and down_proj and of the embedding, the lm_head gather).

On GPU the decode steps' all-reduces run inside their CUDA graphs, where rank 0's clock does not
see them: the decode rows' share is then the lm_head gather's alone (--enforce-eager for the split).
Decode sequences join through the KV hand-off path as in `baton bench decode-step`
(decode.join_prefilled), so no prefill is timed with them; prefill steps are one fresh prompt
each, the prefix cache off.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from baton.loadtest.bench.decode import join_prefilled
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.parallel.state import COLLECTIVES


@dataclass
class TPRow:
    tp: int
    phase: str  # prefill or decode
    batch: int  # sequences in the step
    tokens: int  # tokens computed per step
    steps: int
    median_ms: float
    tokens_per_s: float
    collective_share: float  # of the timed steps' wall time, on rank 0


def _timed(engine: LLMEngine, steps: int, before_step: Any = None) -> tuple[list[float], float]:
    """Step times and the collective seconds within them."""
    times, collective = [], 0.0
    for _ in range(steps):
        if before_step is not None:
            before_step()
        start_clock = COLLECTIVES.seconds
        started = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - started)
        collective += COLLECTIVES.seconds - start_clock
    return times, collective


def measure_decode(engine: LLMEngine, tp: int, batch: int, context: int, steps: int,
                   warmup: int) -> TPRow:
    rng = random.Random(batch * 7919 + context)
    ids = join_prefilled(engine, f"tp-{batch}-{context}", batch, context, warmup + steps + 2, rng)
    try:
        _timed(engine, warmup)
        times, collective = _timed(engine, steps)
    finally:
        for rid in ids:
            engine.abort_request(rid)
    median = statistics.median(times)
    return TPRow(tp, "decode", batch, batch, steps, median * 1e3, batch / median,
                 collective / sum(times))


def measure_prefill(engine: LLMEngine, tp: int, prompt_tokens: int, steps: int,
                    warmup: int) -> TPRow:
    rng = random.Random(prompt_tokens)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    count = iter(range(1 << 30))

    def add_prompt() -> None:
        prompt = [rng.randrange(vocab) for _ in range(prompt_tokens)]
        engine.add_request(f"tp-prefill-{next(count)}", prompt, params)

    _timed(engine, warmup, add_prompt)
    times, collective = _timed(engine, steps, add_prompt)
    median = statistics.median(times)
    return TPRow(tp, "prefill", 1, prompt_tokens, steps, median * 1e3, prompt_tokens / median,
                 collective / sum(times))


def format_rows(rows: list[TPRow]) -> str:
    lines = [f"{'tp':>3}{'phase':>9}{'batch':>7}{'tokens':>8}{'steps':>7}{'median ms':>11}"
             f"{'tok/s':>11}{'vs tp=1':>9}{'collectives':>13}"]
    base = {(r.phase, r.batch, r.tokens): r.tokens_per_s for r in rows if r.tp == 1}
    for r in rows:
        ref = base.get((r.phase, r.batch, r.tokens))
        speedup = "n/a" if ref is None else f"{r.tokens_per_s / ref:.2f}x"
        lines.append(f"{r.tp:>3}{r.phase:>9}{r.batch:>7}{r.tokens:>8}{r.steps:>7}"
                     f"{r.median_ms:>11.2f}{r.tokens_per_s:>11.1f}{speedup:>9}"
                     f"{r.collective_share:>12.0%} ")
    return "\n".join(lines)


def row_dict(row: TPRow) -> dict[str, Any]:
    return asdict(row)
