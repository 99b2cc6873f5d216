"""Overload through the router onto simulated workers, in virtual time (the Replay of replay.py):
Poisson arrivals at a multiple of the workers' capacity, with a TTFT SLO, admission control on or
off.

- on: every request carries the SLO (the router's default), so it is refused at once when its
  predicted TTFT misses, and refused from the queue when it can no longer make its deadline.
- off: no SLO and a queue bounded by nothing this run can reach: everything is served, however late.

Capacity comes from the cost model rather than a measurement, so 1x means the same load on any
machine: a worker fills each step's token budget with prompts, each step costing the fixed part plus
the budget at the prefill rate.
"""
from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass

from baton.loadtest.sim.replay import T0, Replay, ReplayRequest, quantile
from baton.services.engine.config import EngineConfig
from baton.services.router.config import RouterConfig
from baton.services.router.rejections import Rejection
from baton.services.router.router import Outcome


@dataclass(frozen=True)
class OverloadCase:
    load: float  # offered rate as a multiple of capacity
    admission: bool


UNBOUNDED = 10**9  # "off": a queue size and age no run reaches
CASES = (OverloadCase(1.0, True), OverloadCase(1.0,
                                               False), OverloadCase(3.0,
                                                                    True), OverloadCase(3.0, False))
OUTPUT_TOKENS = 16
MODEL_CONTEXT = 2048  # the embedded model's, which the simulated workers serve


def capacity_rps(config: EngineConfig, workers: int, prompt_len: int) -> float:
    """Requests per second the workers can prefill when every step is full of prompts (decode rows
    ignored)."""
    step_s = (config.sim_step_base_seconds +
              config.max_num_batched_tokens / config.sim_prefill_tokens_per_second)
    return workers * config.max_num_batched_tokens / prompt_len / step_s


def poisson_requests(rate: float, seconds: float, prompt_len: int, max_tokens: int,
                     seed: int) -> list[ReplayRequest]:
    """Unique prompts (no shared prefixes), so capacity is the cost model's and not the cache's."""
    rng = random.Random(seed)
    out, t = [], rng.expovariate(rate)
    while t < seconds:
        prompt = [rng.randrange(10, 500) for _ in range(prompt_len)]
        out.append(ReplayRequest(f"o-{len(out)}", t, prompt, max_tokens))
        t += rng.expovariate(rate)
    return out


class OverloadReplay(Replay):
    """A Replay that also times every refusal: from arrival in virtual time (a refusal from the
    queue comes after waiting there), and the wall time of the place() call for refusals made at
    arrival."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.refusal_virtual_s: list[float] = []
        self.refusal_wall_s: list[float] = []

    def _start(self, flight, outcome: Outcome) -> None:
        if isinstance(outcome, Rejection):
            self.refusal_virtual_s.append(self.clock.now - T0 - flight.request.arrival_s)
        super()._start(flight, outcome)

    def _arrive(self, request: ReplayRequest) -> None:
        refused_before = len(self.refusal_virtual_s)
        started = time.perf_counter()
        super()._arrive(request)
        if len(self.refusal_virtual_s) > refused_before:
            self.refusal_wall_s.append(time.perf_counter() - started)


def run_case(case: OverloadCase, engine_config: EngineConfig, workers: int, prompt_len: int,
             max_tokens: int, seconds: float, slo_s: float, seed: int) -> dict:
    rate = case.load * capacity_rps(engine_config, workers, prompt_len)
    requests = poisson_requests(rate, seconds, prompt_len, max_tokens, seed)
    if case.admission:
        router_config = RouterConfig(default_ttft_slo_s=slo_s)
    else:
        router_config = RouterConfig(queue_max_size=UNBOUNDED, queue_max_age_s=UNBOUNDED)
    replay = OverloadReplay("prefix", engine_config, router_config, workers, slo_s)
    started = time.perf_counter()
    result = replay.run(requests)
    ttfts = sorted(f.ttft_s for f in replay.done if f.ttft_s is not None)
    refusals_v, refusals_w = sorted(replay.refusal_virtual_s), sorted(replay.refusal_wall_s)
    return dict(
        load=f"{case.load:g}x",
        admission="on" if case.admission else "off",
        offered_rps=rate,
        requests=result.requests,
        admitted=len(ttfts),
        refused=result.rejected,
        goodput_rps=result.goodput_rps,
        ttft_p99_ms=quantile(ttfts, 0.99) * 1e3,
        admitted_late=sum(t > slo_s for t in ttfts),
        # Rounded to the microsecond: virtual times sit near T0, where float noise is ~1e-10 s.
        refusal_p99_ms=round(quantile(refusals_v, 0.99) * 1e3, 3),
        refusal_max_ms=round((refusals_v or [0.0])[-1] * 1e3, 3),
        refusal_wall_p99_ms=quantile(refusals_w, 0.99) * 1e3,
        virtual_s=result.makespan_s,
        wall_s=time.perf_counter() - started)


def bench_overload(args: argparse.Namespace) -> list[dict]:
    """`baton bench router --mode overload`: every case of CASES on --replay-workers simulated
    workers."""
    from baton.services.checkpoints.tiny_model import embedded_model_path

    if args.prompt_len + OUTPUT_TOKENS > MODEL_CONTEXT:
        raise SystemExit(
            f"--prompt-len must be at most {MODEL_CONTEXT - OUTPUT_TOKENS} for the simulated model")
    engine_config = EngineConfig(engine="sim", model=str(embedded_model_path()),
                                 num_kv_blocks=args.kv_blocks)
    capacity = capacity_rps(engine_config, args.replay_workers, args.prompt_len)
    print(
        f"capacity (cost model): {capacity:.1f} requests/s on {args.replay_workers} workers, "
        f"{args.prompt_len}-token prompts, {OUTPUT_TOKENS} output tokens, TTFT SLO "
        f"{args.ttft_slo_ms:g} ms, "
        f"{args.seconds:g} s of arrivals")
    return [
        run_case(case, engine_config, args.replay_workers, args.prompt_len, OUTPUT_TOKENS,
                 args.seconds, args.ttft_slo_ms / 1000, args.seed) for case in CASES
    ]
