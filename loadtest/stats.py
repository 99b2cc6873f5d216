"""Load-test statistics from client-side timelines: latency percentiles, SLO attainment and goodput.

Conventions (those of vLLM's benchmark_serving and DistServe, so figures compare with theirs):
- TTFT: request sent to first token received; E2E: sent to last token.
- TPOT per request: (E2E - TTFT) / (output tokens - 1); undefined for one-token answers.
- ITL: every gap between consecutive streamed tokens, pooled over all requests.
- A request meets the SLO when it was answered, its TTFT is within the TTFT target and its TPOT
  (when defined) within the TPOT target. Refused and failed requests never meet it: they are
  counted, not dropped, so an overloaded server cannot look fast by turning work away.
- Attainment: requests meeting the SLO over all requests sent.
- Goodput, vLLM's way: requests meeting the SLO per second of the run.
- Goodput, DistServe's way: the highest request rate of a sweep at which attainment is at least 90%.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

OK, REFUSED, FAILED = "ok", "refused", "failed"
PERCENTILES = (50, 90, 99)
DISTSERVE_ATTAINMENT = 0.9


@dataclass
class RequestResult:
    start_s: float  # when it was sent, seconds since the run began
    status: str  # OK, REFUSED or FAILED
    ttft_s: float | None = None
    e2e_s: float | None = None
    itls_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    # prompt tokens the server took from its prefix cache, when it says
    cached_tokens: int | None = None
    error: str = ""
    refusal_s: float | None = None  # refused: from sending the request to receiving the refusal

    @property
    def tpot_s(self) -> float | None:
        if self.status != OK or self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class SLO:
    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def __bool__(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None

    def met(self, r: RequestResult) -> bool:
        if r.status != OK or r.ttft_s is None:
            return False
        if self.ttft_ms is not None and r.ttft_s * 1000 > self.ttft_ms:
            return False
        tpot = r.tpot_s
        return self.tpot_ms is None or tpot is None or tpot * 1000 <= self.tpot_ms


def percentiles(values: Sequence[float],
                ps: Iterable[float] = PERCENTILES) -> dict[str, float | None]:
    """p50/p90/p99 by linear interpolation between order statistics (numpy's default, as vLLM
    reports)."""
    if len(values) == 0:
        return {f"p{p:g}": None for p in ps}
    arr = np.asarray(values, dtype=float)
    return {f"p{p:g}": float(np.percentile(arr, p)) for p in ps}


def _latency(values: Sequence[float]) -> dict[str, float | None]:
    """Mean and percentiles in milliseconds."""
    ms = [v * 1000 for v in values]
    return {"mean": float(np.mean(ms)) if ms else None, **percentiles(ms)}


def attainment(results: Sequence[RequestResult], slo: SLO) -> float | None:
    return sum(slo.met(r) for r in results) / len(results) if results and slo else None


def goodput_rps(results: Sequence[RequestResult], slo: SLO, duration_s: float) -> float | None:
    """vLLM's goodput: requests that met every SLO per second."""
    if not slo or duration_s <= 0:
        return None
    return sum(slo.met(r) for r in results) / duration_s


def distserve_goodput(points: Sequence[tuple[float, float | None]],
                      target: float = DISTSERVE_ATTAINMENT) -> float | None:
    """DistServe's goodput: the highest rate among (rate, attainment) points whose attainment is at
    least target; None when none is (the sweep started above what the system can serve)."""
    good = [rate for rate, att in points if att is not None and att >= target]
    return max(good) if good else None


def prefix_hit_ratio(results: Sequence[RequestResult]) -> float | None:
    """Share of the prompt tokens the server served from its prefix cache, over the answers that
    report it."""
    told = [r for r in results if r.status == OK and r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in told)
    return sum(r.cached_tokens for r in told) / prompt if prompt else None


def prefix_reuse_bound(prompts: Iterable[Sequence[int]], block_size: int) -> float | None:
    """Share of prompt tokens one unlimited prefix cache seeing every prompt in order could serve:
    the hit ratio of a perfect router over caches that never evict. Block-granular, and like a real
    engine it always computes a prompt's last token."""
    seen: set[int] = set()
    hits = total = 0
    for prompt in prompts:
        chain, cached, leading = 0, 0, True
        for start in range(0, len(prompt) - block_size + 1, block_size):
            chain = hash((chain, tuple(prompt[start:start + block_size])))
            leading = leading and chain in seen
            cached += block_size if leading else 0
            seen.add(chain)
        hits += min(cached, len(prompt) - 1)
        total += len(prompt)
    return hits / total if total else None


def summarize(results: Sequence[RequestResult], duration_s: float,
              slo: SLO = SLO()) -> dict[str, object]:
    """Everything the report prints, as plain numbers (JSON-ready). duration_s is the run's wall
    time."""
    ok = [r for r in results if r.status == OK]
    counts = {s: sum(r.status == s for r in results) for s in (OK, REFUSED, FAILED)}
    tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(results),
        "completed": counts[OK],
        "refused": counts[REFUSED],
        "failed": counts[FAILED],
        "duration_s": duration_s,
        "request_throughput_rps": counts[OK] / duration_s if duration_s > 0 else None,
        "output_throughput_tps": tokens / duration_s if duration_s > 0 else None,
        "output_tokens": tokens,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "prefix_hit_ratio": prefix_hit_ratio(results),
        "ttft_ms": _latency([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": _latency([t for r in ok if (t := r.tpot_s) is not None]),
        "itl_ms": _latency([g for r in ok for g in r.itls_s]),
        "e2e_ms": _latency([r.e2e_s for r in ok if r.e2e_s is not None]),
        "refusal_ms": _latency([r.refusal_s for r in results if r.refusal_s is not None]),
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
        "slo_attainment": attainment(results, slo),
        "goodput_rps": goodput_rps(results, slo, duration_s),
        "errors": sorted({r.error for r in results if r.error})[:10],
    }
