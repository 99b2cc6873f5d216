"""Trace replay through the router onto simulated workers, in virtual time: a capacity simulator.

Each worker is a real LLMEngine with the simulated runner (real scheduler, block manager and prefix
cache with a finite KV cache), whose steps advance that worker's own clock by the cost model instead
of sleeping. The router is the real facade on the shared virtual clock, fed the workers' real KV
events after every step and their stats every poll interval, as the service would feed it. A
discrete-event loop interleaves arrivals and worker steps in time order, so an hour of trace replays
in seconds and the figures do not depend on this machine's speed.

Policies: `prefix` (the configured router), `load` (the router with prefix affinity and the prefix
scorer off) and `round-robin` (no router).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from baton.loadtest.sim.runner import SimulatedRunner
from baton.loadtest.stats import prefix_reuse_bound
from baton.loadtest.traces import TraceRequest
from baton.loadtest.workloads import scaled_trace
from baton.services.common.messages.router import Placement, PlaceRequest
from baton.services.common.messages.worker import EventKind, KVEvent, KVEventBatch, LoadReport
from baton.services.common.roles import Role
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.router.config import RouterConfig
from baton.services.router.rejections import Rejection
from baton.services.router.router import Outcome, Router

POLICIES = ("prefix", "load", "round-robin")
T0 = 1_000_000.0  # virtual epoch: far from 0 so stats timestamps look like real ones


@dataclass(frozen=True)
class ReplayRequest:
    request_id: str
    arrival_s: float
    prompt: list[int]
    max_tokens: int


@dataclass
class ReplayResult:
    policy: str
    requests: int
    rejected: int
    # prompt tokens served from a prefix cache / prompt tokens, as the engines counted them
    hit_ratio: float
    ttft_p50_s: float
    ttft_p99_s: float
    goodput_rps: float  # requests whose first token met the SLO, per second of replay
    slo_attainment: float
    makespan_s: float


@dataclass
class _SimWorker:
    worker_id: str
    engine: LLMEngine
    free_at: float = T0
    sequence: int = 0


@dataclass
class _Flight:
    request: ReplayRequest
    lease_id: str | None
    ttft_s: float | None = None


@dataclass
class _Clock:
    now: float = T0

    def __call__(self) -> float:
        return self.now


def build_requests(rows: Sequence[TraceRequest], pool, scale: float, speedup: float, max_len: int,
                   seed: int = 0) -> list[ReplayRequest]:
    """The load test's scaled trace (loadtest.workloads.scaled_trace: lengths divided by `scale`,
    each hash id a block of 512/scale tokens, rows longer than max_len left out) with arrivals
    compressed by `speedup`."""
    return [
        ReplayRequest(f"trace-{i}", row.arrival_s / speedup, prompt, out_len)
        for i, (row, (prompt, out_len)) in enumerate(scaled_trace(rows, scale, pool, seed, max_len))
    ]


def quantile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def unlimited_cache_hit_ratio(requests: Sequence[ReplayRequest], block_size: int) -> float:
    """The bound: every block ever computed stays cached everywhere (one infinite cache)."""
    return prefix_reuse_bound([r.prompt for r in requests], block_size) or 0.0


class Replay:

    def __init__(self, policy: str, engine_config: EngineConfig, router_config: RouterConfig,
                 num_workers: int, ttft_slo_s: float, stats_interval_s: float = 0.1) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}")
        self.policy = policy
        self.ttft_slo_s = ttft_slo_s
        self.stats_interval_s = stats_interval_s
        self.clock = _Clock()
        self.workers = [_SimWorker(f"sim-{i}", LLMEngine(engine_config, sim_runner=SimulatedRunner))
                        for i in range(num_workers)]
        for w in self.workers:
            w.engine.blocks.record_events = True
            # time is the virtual clock's, advanced per step
            w.engine.runner.sleep = lambda seconds: None
        if policy == "load":
            # The prefix scorer off (a weight of 0, as the picker drops those) and no affinity.
            scorers = [e for e in router_config.scorers if e.name != "prefix_overlap"]
            router_config = router_config.model_copy(update=dict(scorers=scorers,
                                                                 sticky_queued_prefill_tokens=0))
        # A placement reaches a simulated worker at once, so its next report includes it (no grace);
        # a fixed seed keeps the replay's ties, and so its results, the same run to run.
        router_config = router_config.model_copy(update=dict(
            model=self.workers[0].engine.model_id, block_size=engine_config.block_size,
            reservation_grace_s=0.0, seed=0 if router_config.seed is None else router_config.seed))
        self.router = Router(router_config, clock=self.clock, on_queued_outcome=self._on_outcome)
        for w in self.workers:
            self.router.register_worker(w.worker_id, w.worker_id, Role.MIXED, lease_ttl_s=math.inf)
        self._by_id = {w.worker_id: w for w in self.workers}
        self._rr = itertools.cycle(self.workers)
        self.flights: dict[str, _Flight] = {}
        self.done: list[_Flight] = []
        self.rejected = 0
        self._next_stats = T0

    def _on_outcome(self, outcome: Outcome) -> None:
        flight = self.flights.get(outcome.request_id)
        if flight is not None:
            self._start(flight, outcome)

    def _start(self, flight: _Flight, outcome: Outcome) -> None:
        if isinstance(outcome, Rejection):
            self.rejected += 1
            del self.flights[flight.request.request_id]
            return
        flight.lease_id = outcome.lease_id
        self._run_on(self._by_id[outcome.decode_worker_id], flight)

    def _run_on(self, worker: _SimWorker, flight: _Flight) -> None:
        r = flight.request
        worker.engine.add_request(
            r.request_id, r.prompt,
            SamplingParams(max_tokens=r.max_tokens, ignore_eos=True, temperature=0.0))
        worker.free_at = max(worker.free_at, self.clock.now)

    def _arrive(self, request: ReplayRequest) -> None:
        flight = _Flight(request, None)
        self.flights[request.request_id] = flight
        if self.policy == "round-robin":
            self._run_on(next(self._rr), flight)
            return
        outcome = self.router.place(
            PlaceRequest(request.request_id, request.prompt, max_tokens=request.max_tokens))
        if isinstance(outcome, (Placement, Rejection)):
            self._start(flight, outcome)

    def _step(self, worker: _SimWorker) -> None:
        self.clock.now = worker.free_at
        outputs = worker.engine.step()
        worker.free_at += worker.engine.runner.last_step_seconds
        for out in outputs:
            flight = self.flights[out.request_id]
            if flight.ttft_s is None:
                flight.ttft_s = worker.free_at - T0 - flight.request.arrival_s
            if out.finished:
                del self.flights[out.request_id]
                self.done.append(flight)
                if flight.lease_id is not None:
                    self.clock.now = worker.free_at
                    self.router.release(flight.lease_id, flight.ttft_s, len(out.token_ids))
        self._publish_events(worker)

    def _publish_events(self, worker: _SimWorker) -> None:
        events, worker.engine.blocks.events = worker.engine.blocks.events, []
        if not events or self.policy == "round-robin":
            return
        batch = []
        for kind, block_hash in events:
            worker.sequence += 1
            batch.append(KVEvent(worker.sequence,
                                 EventKind.STORED if kind == "stored" else EventKind.REMOVED,
                                 (block_hash,)))
        self.router.on_kv_events(KVEventBatch(worker.worker_id, tuple(batch)))

    def _publish_stats(self) -> None:
        while self._next_stats <= self.clock.now:
            for w in self.workers:
                e = w.engine
                # stamped in whole milliseconds, as a worker's stats are
                self.router.on_stats(
                    LoadReport(timestamp_s=int(self._next_stats * 1000) / 1000.0,
                               num_running=len(e.scheduler.running),
                               num_waiting=len(e.scheduler.waiting),
                               kv_blocks_used=e.blocks.num_blocks - e.blocks.num_free_blocks,
                               kv_blocks_total=e.blocks.num_blocks,
                               prefill_tokens_queued=e.scheduler.prefill_tokens_queued(),
                               worker_id=w.worker_id, role=Role.MIXED))
            self._next_stats += self.stats_interval_s
            self.router.tick()

    def run(self, requests: Sequence[ReplayRequest]) -> ReplayResult:
        pending = sorted(requests, key=lambda r: r.arrival_s)
        i = 0
        while i < len(pending) or self.flights:
            busy = [w for w in self.workers if w.engine.has_unfinished_requests()]
            next_step = min(busy, key=lambda w: w.free_at) if busy else None
            arrival = T0 + pending[i].arrival_s if i < len(pending) else math.inf
            if next_step is None and arrival == math.inf:
                break  # only queued requests whose outcome never comes: nothing left can move
            if next_step is None or arrival <= next_step.free_at:
                self.clock.now = arrival
                self._publish_stats()
                self._arrive(pending[i])
                i += 1
            else:
                self._step(next_step)
                self._publish_stats()
        return self._result(len(pending))

    def _result(self, offered: int) -> ReplayResult:
        queries = sum(w.engine.scheduler.stats.prefix_cache_queries for w in self.workers)
        hits = sum(w.engine.scheduler.stats.prefix_cache_hits for w in self.workers)
        ttfts = sorted(f.ttft_s for f in self.done if f.ttft_s is not None)
        good = sum(t <= self.ttft_slo_s for t in ttfts)
        makespan = max(w.free_at for w in self.workers) - T0
        return ReplayResult(self.policy, offered, self.rejected, hits / queries if queries else 0.0,
                            quantile(ttfts, 0.5), quantile(ttfts, 0.99),
                            good / makespan if makespan > 0 else 0.0,
                            good / offered if offered else 0.0, makespan)
