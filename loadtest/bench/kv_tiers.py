"""Multi-turn conversations against KV tiers: the same conversations, greedy, on the same engine
shape with and without tiers below its (small) device cache.

Conversation lengths come from a public trace (the Azure 2023 conversation trace by default),
divided by a stated scale: each trace row is one turn, its prefill length the new message and its
decode length the answer. A turn's prompt is the conversation so far (earlier prompts and answers)
plus the new message. Turns are served turn-major, a fixed number in flight (closed loop): every
conversation's first turn, then every second turn, so that between two turns of one conversation
the others' traffic has pushed its KV out of the device cache.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

from baton.loadtest.traces import TraceRequest
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.llm_engine import LLMEngine


@dataclass(frozen=True)
class Turn:
    message: list[int]  # the new tokens of this turn's prompt
    output_len: int


def conversations(rows: list[TraceRequest], count: int, turns: int, scale: float,
                  vocab_size: int, avoid: set[int], seed: int) -> list[list[Turn]]:
    """count conversations of `turns` turns from consecutive trace rows, lengths divided by
    scale."""
    if len(rows) < count * turns:
        raise ValueError(f"the trace has {len(rows)} rows; {count} x {turns} turns need more")
    rng = random.Random(seed)
    allowed = [t for t in range(vocab_size) if t not in avoid]
    out = []
    for c in range(count):
        conv = []
        for row in rows[c * turns:(c + 1) * turns]:
            n = max(1, round(row.input_len / scale))
            conv.append(Turn([rng.choice(allowed) for _ in range(n)],
                             max(1, round(row.output_len / scale))))
        out.append(conv)
    return out


@dataclass
class TierRun:
    name: str
    prompt_tokens: int = 0
    computed: int = 0  # prompt tokens run through the model
    cached: dict[str, int] = field(default_factory=dict)  # tokens served per tier
    ttft: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    preemptions: int = 0
    outputs: dict[str, list[int]] = field(default_factory=dict)  # by request id, sans system

    def ttft_p(self, q: float) -> float:
        ordered = sorted(self.ttft)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_conversations(engine: LLMEngine, convs: list[list[Turn]], in_flight: int,
                      name: str) -> TierRun:
    """Serves every turn, turn-major, in_flight at a time; TTFT is submit to first token."""
    history = [[] for _ in convs]
    order = [(t, c) for t in range(len(convs[0])) for c in range(len(convs))]
    result = TierRun(name)
    # request id (conversation-turn, the same in every system's run) -> conversation, submit time
    pending: dict[str, tuple[int, float]] = {}
    first_seen: set[str] = set()
    before = _counts(engine)
    started = time.perf_counter()
    while order or pending:
        while order and len(pending) < in_flight:
            t, c = order.pop(0)
            turn = convs[c][t]
            history[c] = history[c] + turn.message
            rid = f"{c}-{t}"
            params = SamplingParams(max_tokens=turn.output_len, temperature=0.0, ignore_eos=True)
            engine.add_request(rid, list(history[c]), params)
            result.prompt_tokens += len(history[c])
            pending[rid] = (c, time.perf_counter())
        for out in engine.step():
            c, submitted = pending[out.request_id]
            if out.request_id not in first_seen and out.token_ids:
                first_seen.add(out.request_id)
                result.ttft.append(time.perf_counter() - submitted)
            if out.finished:
                del pending[out.request_id]
                history[c] = history[c] + out.token_ids
                result.outputs[out.request_id] = out.token_ids
    result.elapsed = time.perf_counter() - started
    after = _counts(engine)
    result.computed = after["computed"] - before["computed"]
    result.preemptions = after["preemptions"] - before["preemptions"]
    result.cached = {k: after[k] - before[k] for k in ("device", "host", "disk") if k in after}
    return result


def _counts(engine: LLMEngine) -> dict[str, int]:
    """The engine's running totals, so that a run counts only its own work (not a warm-up's)."""
    out = {"computed": engine.counters.prompt_tokens_computed,
           "preemptions": engine.scheduler.stats.preemptions,
           "device": engine.scheduler.stats.prefix_cache_hits}
    if engine.tiers is not None:
        out.update({tier: stats.hits for tier, stats in engine.tiers.stats.items()})
    return out


def format_runs(runs: list[TierRun]) -> str:
    head = (f"{'system':<14}{'prompt tok':>11}{'computed':>10}{'recompute x':>12}"
            f"{'device hit':>11}{'host hit':>10}{'disk hit':>10}{'TTFT p50 ms':>13}"
            f"{'TTFT p90 ms':>13}{'elapsed s':>11}{'preempt':>9}")
    lines = [head]
    base = runs[0].computed
    for r in runs:
        lines.append(
            f"{r.name:<14}{r.prompt_tokens:>11}{r.computed:>10}{base / max(1, r.computed):>12.2f}"
            f"{r.cached.get('device', 0):>11}{r.cached.get('host', 0):>10}"
            f"{r.cached.get('disk', 0):>10}{1000 * r.ttft_p(0.5):>13.1f}"
            f"{1000 * r.ttft_p(0.9):>13.1f}{r.elapsed:>11.2f}{r.preemptions:>9}")
    return "\n".join(lines)


def summary(r: TierRun) -> dict[str, object]:
    return {"system": r.name, "prompt_tokens": r.prompt_tokens, "computed": r.computed,
            "cached": r.cached, "ttft_p50_s": r.ttft_p(0.5), "ttft_p90_s": r.ttft_p(0.9),
            "ttft_mean_s": statistics.fmean(r.ttft), "elapsed_s": r.elapsed,
            "preemptions": r.preemptions}
