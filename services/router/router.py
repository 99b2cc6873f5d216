"""The router facade a gRPC servicer wraps: membership, load and KV-event feeds, place / release,
drain, stats.

Concurrency: every method is synchronous and thread-safe (one re-entrant lock around the state).
None of them does I/O or waits, and a decision takes well under a millisecond, so an asyncio
servicer may call them inline on its event loop; a threaded servicer may call them from any thread.
Requests that must wait for capacity are answered later through the `on_queued_outcome` callback,
called under the lock (it must only hand the outcome over, such as resolving a future with
loop.call_soon_threadsafe, and not call back into the router).
"""
from __future__ import annotations

import math
import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry

from baton.services.common.block_hash import block_hashes
from baton.services.common.messages.router import Placement, PlaceRequest, PoolStats, RouterStats
from baton.services.common.messages.worker import KVEventBatch, KVSnapshot, LoadReport
from baton.services.common.roles import Role
from baton.services.router.admission import Admission, AdmissionQueue, FairShare, RetryPolicy
from baton.services.router.affinity_keys import AffinityKeys
from baton.services.router.config import PluginSettings, RouterConfig
from baton.services.router.metrics import RouterMetrics, WorkerLoadRow
from baton.services.router.planner import Pending, Plan, Planner
from baton.services.router.pool_stats import load_rows, pool_stats
from baton.services.router.plugins.filters import default_filters
from baton.services.router.plugins.picker import Picker, StickyPolicy
from baton.services.router.plugins.registry import scorer_class
from baton.services.router.prefix_index import PrefixIndex
from baton.services.router.rejections import RejectReason, Rejection
from baton.services.router.runtime_loras import RuntimeLoRAs
from baton.services.router.served_models import served_model_stats
from baton.services.router.ttft_predictor import TTFTPredictor
from baton.services.router.worker_state import CircuitBreaker, SaturationLimits, WorkerState


@dataclass(frozen=True)
class Queued:
    request_id: str
    predicted_ttft_s: float


Outcome = Placement | Rejection
# A request for a runtime adapter no worker has loaded yet: its feeds are loading it (one poll).
LORA_RETRY_AFTER_S = 1.0


@dataclass
class _Lease:
    lease_id: str
    tenant: str
    decode_id: str
    prefill_id: str | None
    queued_ahead_tokens: int
    uncached_tokens: int
    max_tokens: int
    expires_at: float


class Router:
    def __init__(self, config: RouterConfig, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time,
                 on_queued_outcome: Callable[[Outcome], None] | None = None) -> None:
        self.config = config
        self._clock = clock
        self._on_queued_outcome = on_queued_outcome or (lambda outcome: None)
        self._lock = threading.RLock()
        self._workers: dict[str, WorkerState] = {}
        self._leases: OrderedDict[str, _Lease] = OrderedDict()
        self.index = PrefixIndex(config.approx_index_ttl_s,
                                 config.approx_index_max_blocks_per_worker, clock)
        self.predictor = TTFTPredictor(config.initial_prefill_tokens_per_s,
                                       config.prefill_rate_ewma_alpha, config.ttft_overhead_s)
        self.metrics = RouterMetrics(registry if registry is not None else CollectorRegistry())
        self.metrics.watch_workers(self._load_rows)
        self.admission = Admission(
            AdmissionQueue(config.queue_max_size, config.queue_max_age_s, FairShare()),
            RetryPolicy(config.retry_after_min_s, config.retry_after_max_s), self.metrics,
            config.ttft_slo_headroom)
        self.limits = SaturationLimits(config.stats_max_age_s,
                                       config.saturation_queued_prefill_tokens,
                                       config.saturation_inflight_requests,
                                       config.saturation_kv_utilization)
        self.affinity = AffinityKeys(config.affinity_keys_max)
        # the router's lock guards it too; a change may let a queued request be placed
        self.runtime_loras = RuntimeLoRAs(self._lock, self._workers, config, clock,
                                          lambda: self._dispatch(self._clock()))
        self.planner = Planner(config, self.index, self.predictor, self.admission, self.affinity)
        self._rng = random.Random(config.seed)
        self.apply_plugin_settings(config.plugin_settings())

    # -- configuration -----------------------------------------------------------------------------

    def apply_plugin_settings(self, settings: PluginSettings) -> None:
        """Swaps in new scorer weights and affinity thresholds; decisions already made are
        unaffected."""
        scorers = [scorer_class(entry.name).from_config(entry.weight, self.config)
                   for entry in settings.scorers]
        sticky = StickyPolicy(settings.sticky_queued_prefill_tokens,
                              settings.sticky_inflight_requests,
                              settings.sticky_min_cached_fraction)
        tol = self.config.tie_tolerance
        with self._lock:
            self.plugin_settings = settings
            self._decode_picker = Picker(default_filters([Role.DECODE, Role.MIXED]), scorers,
                                         sticky, self.limits, self._rng, tol)
            self._prefill_picker = Picker(default_filters([Role.PREFILL]), scorers, sticky,
                                          self.limits, self._rng, tol)

    # -- membership --------------------------------------------------------------------------------

    def register_worker(self, worker_id: str, address: str, role: Role, model: str | None = None,
                        block_size: int | None = None, lease_ttl_s: float | None = None) -> float:
        """Adds or refreshes a worker; returns when its registration lease expires (inf for a static
        worker)."""
        if not worker_id or not address:
            raise ValueError("a worker needs an id and an address")
        model = model or self.config.model
        if model not in self.config.served_models():
            raise ValueError(f"worker {worker_id} serves {model!r}, this router routes "
                             f"{', '.join(map(repr, self.config.served_models()))}")
        if block_size and block_size != self.config.block_size:
            raise ValueError(
                f"worker {worker_id} has block size {block_size}, the router "
                f"{self.config.block_size}"
            )
        ttl = self.config.worker_lease_ttl_s if lease_ttl_s is None else lease_ttl_s
        with self._lock:
            worker = self._workers.get(worker_id)
            if (worker is None or worker.role is not Role(role) or worker.address != address
                    or worker.model != model):
                if worker is not None:
                    self.index.remove_worker(worker_id)
                breaker = CircuitBreaker(self.config.circuit_failure_threshold,
                                         self.config.circuit_cooldown_s)
                worker = WorkerState(worker_id, address, Role(role), breaker, model=model)
                self._workers[worker_id] = worker
                self.index.set_events_available(worker_id, False)
            worker.lease_expires_at = self._clock() + ttl
            return worker.lease_expires_at

    def heartbeat(self, worker_id: str) -> float:
        """Extends the registration lease; KeyError for an unknown worker, which should register
        again."""
        with self._lock:
            worker = self._workers[worker_id]
            worker.lease_expires_at = self._clock() + self.config.worker_lease_ttl_s
            return worker.lease_expires_at

    def remove_worker(self, worker_id: str) -> None:
        with self._lock:
            if self._workers.pop(worker_id, None) is not None:
                self.index.remove_worker(worker_id)
                self.runtime_loras.forget(worker_id)
                self.predictor.forget(worker_id)
                self.metrics.observed_ttft.remove(worker_id)

    def members(self) -> list[str]:
        """Ids of the workers known now (registered, static or discovered)."""
        with self._lock:
            return list(self._workers)

    def endpoints(self) -> list[tuple[str, str, Role, bool, str]]:
        """(id, address, role, draining, model) of each live worker: where the gateway fans
        runtime LoRA loads and unloads out to."""
        with self._lock:
            now = self._clock()
            return [(w.worker_id, w.address, w.role, w.draining, w.model)
                    for w in self._workers.values() if w.is_alive(now)]

    def drain(self, worker_ids: Iterable[str]) -> list[str]:
        """Stops new placements on these workers (their current requests finish); returns the
        unknown ids."""
        unknown = []
        with self._lock:
            for worker_id in worker_ids:
                if worker_id in self._workers:
                    self._workers[worker_id].draining = True
                else:
                    unknown.append(worker_id)
        return unknown

    # -- feeds from workers ------------------------------------------------------------------------

    def on_stats(self, report: LoadReport) -> bool:
        """A worker's load; False when the worker is not registered (the report is dropped)."""
        with self._lock:
            worker = self._workers.get(report.worker_id)
            if worker is None:
                return False
            worker.on_stats(report, self.config.reservation_grace_s)
            self.predictor.measured(report.worker_id, report.prefill_tokens_per_s)
            self._dispatch(self._clock())
            return True

    def on_kv_events(self, batch: KVEventBatch) -> bool:
        """A worker's block events; False when the worker must be resynced with a KVSnapshot."""
        with self._lock:
            if batch.worker_id not in self._workers:
                return True
            in_sync = self.index.apply_events(batch.worker_id, batch.events, gap=batch.gap)
            if in_sync:
                self.index.set_events_available(batch.worker_id, True)
            return in_sync

    def on_kv_snapshot(self, snapshot: KVSnapshot) -> None:
        """Replaces the worker's index entries; its events resume after snapshot.sequence."""
        with self._lock:
            if snapshot.worker_id in self._workers:
                self.index.apply_snapshot(snapshot.worker_id, snapshot.sequence,
                                          snapshot.block_hashes, snapshot.host_block_hashes,
                                          snapshot.disk_block_hashes)
                self.index.set_events_available(snapshot.worker_id, True)

    def set_events_available(self, worker_id: str, available: bool) -> None:
        """The servicer says whether the worker's event stream is up; without it, placements
        approximate it."""
        with self._lock:
            self.index.set_events_available(worker_id, available)

    def forget_cached_blocks(self, worker_id: str) -> None:
        """The worker's event stream broke with the worker unreachable (it died, or is
        restarting): the index stops claiming any of its blocks until a snapshot resyncs it."""
        with self._lock:
            if worker_id in self._workers:
                self.index.forget(worker_id)

    def report_failure(self, worker_id: str) -> None:
        """A failure seen outside a lease (a refused connection, a broken stream) counts toward the
        breaker."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is not None:
                worker.breaker.record_failure(self._clock())

    # -- decisions ---------------------------------------------------------------------------------

    def _validate(self, req: PlaceRequest) -> None:
        if not req.request_id:
            raise ValueError("request_id is required")
        if len(req.prompt_token_ids) == 0:
            raise ValueError("the prompt has no tokens")
        if min(req.prompt_token_ids) < 0:
            raise ValueError("token ids must be non-negative")
        if req.max_tokens < 0:
            raise ValueError("max_tokens must be non-negative")
        if req.ttft_slo_s is not None and req.ttft_slo_s <= 0:
            raise ValueError("ttft_slo_s must be positive")
        if req.tpot_slo_s is not None and req.tpot_slo_s <= 0:
            raise ValueError("tpot_slo_s must be positive")

    def place(self, req: PlaceRequest) -> Placement | Rejection | Queued:
        """Places now, queues until a worker has room (the outcome then goes to on_queued_outcome),
        or refuses. ValueError for a malformed request."""
        started = time.perf_counter()
        self._validate(req)
        req = replace(req, model=req.model or self.config.model)
        if req.model not in self.config.served_models():
            return self._reject(req.request_id, RejectReason.UNKNOWN_MODEL,
                                f"model {req.model!r} is not served here; this router routes "
                                f"{', '.join(map(repr, self.config.served_models()))}")
        # Hashing is the costliest step and needs no shared state, so it runs outside the lock.
        hashes = block_hashes(req.prompt_token_ids, self.config.block_size, req.model,
                              req.cache_salt, lora_name=req.lora_name)
        slo_s = req.ttft_slo_s if req.ttft_slo_s is not None else self.config.default_ttft_slo_s
        tpot_slo_s = (req.tpot_slo_s
                      if req.tpot_slo_s is not None else self.config.default_tpot_slo_s)
        pending = Pending(req, hashes, slo_s, tpot_slo_s)
        with self._lock:
            now = self._clock()
            self._dispatch(now)
            outcome = self._place_new(pending, now)
        self.metrics.decision_latency.observe(time.perf_counter() - started)
        return outcome

    def _place_new(self, pending: Pending, now: float) -> Placement | Rejection | Queued:
        req, queue = pending.request, self.admission.queue
        plan = self._plan(pending, now)
        if isinstance(plan, Rejection):
            return plan
        if plan is None:
            return self._reject(req.request_id, RejectReason.NO_WORKERS,
                                "no worker can take the request")
        if len(queue) == 0 and not plan.saturated:
            refusal = self.admission.check_slo(req.request_id, plan.predicted_ttft_s, pending.slo_s)
            return refusal if refusal is not None else self._commit(plan, pending, now)
        if req.priority < 0:
            return self._reject(req.request_id, RejectReason.SHED,
                                "sheddable request and every worker is saturated",
                                self._queue_wait_s(req.priority))
        predicted = self._queue_wait_s(req.priority) + plan.predicted_ttft_s
        refusal = self.admission.check_slo(req.request_id, predicted, pending.slo_s)
        if refusal is not None:
            return refusal
        # The deadline by which it must leave the queue keeps the admission headroom: leaving at now
        # + SLO with a prediction that always errs some would land it late as often as not.
        deadline = (now + pending.slo_s * self.admission.slo_headroom
                    if pending.slo_s is not None else float("inf"))
        cost = len(req.prompt_token_ids) + req.max_tokens
        item = queue.make(req.request_id, req.tenant, req.priority, cost, now, deadline, pending)
        accepted, displaced = queue.push(item)
        if displaced is not None:
            self._on_queued_outcome(
                self._reject(displaced.request_id, RejectReason.PREEMPTED,
                             "displaced from the full queue by a higher-priority request",
                             self._queue_wait_s(displaced.priority)))
        if not accepted:
            return self._reject(req.request_id, RejectReason.QUEUE_FULL,
                                "the admission queue is full", self._queue_wait_s(req.priority))
        self.metrics.decisions.labels("queued", "saturated").inc()
        return Queued(req.request_id, predicted)

    def _reject(self, request_id: str, reason: RejectReason, message: str,
                retry_after_s: float | None = None) -> Rejection:
        return self.admission.reject(request_id, reason, message, retry_after_s)

    def _queue_wait_s(self, priority: int) -> float:
        """How long the router queue ahead of a request of this priority takes to drain through the
        workers."""
        rate = self.predictor.pool_tokens_per_s(self._workers)
        return self.admission.queue.tokens_ahead(priority) / rate if rate > 0 else 0.0

    def _plan(self, pending: Pending, now: float) -> Plan | Rejection | None:
        # Only the request's model's pools are candidates, before any plugin sees them: the
        # TPOT fit and the disaggregation decision judge load, and another model's workers
        # must not count toward it.
        req = pending.request
        candidates = [w for w in self._workers.values() if w.model == req.model]
        # A runtime adapter goes only where it is loaded; the others get it from their feeds.
        ready = [w for w in candidates if self.runtime_loras.serves(w, req.lora_name)]
        if candidates and not ready:
            return self._reject(req.request_id, RejectReason.NO_WORKERS,
                                f"no worker has the LoRA adapter {req.lora_name!r} loaded yet; it "
                                "is being loaded", LORA_RETRY_AFTER_S)
        candidates = ready
        return self.planner.plan(pending, candidates, self._decode_picker, self._prefill_picker,
                                 now)

    def _commit(self, plan: Plan, pending: Pending, now: float) -> Placement:
        req, sreq, bs = pending.request, plan.sreq, self.config.block_size
        lease_id = uuid.uuid4().hex
        computing = plan.computing
        uncached = sreq.uncached_tokens(computing.worker_id)
        # Local prefill queues its tokens on the decode worker; with a hand-off the decode worker
        # still allocates the blocks it pulls, so it is charged that KV either way, and the KV its
        # output will fill. Without the output, full cache hits would look free and a hot prefix
        # would pile onto one worker.
        decode_tokens = uncached if plan.prefill is None else 0
        decode_blocks = math.ceil(
            (sreq.uncached_tokens(plan.decode.worker_id) + req.max_tokens) / bs)
        plan.decode.reserve(lease_id, now, decode_tokens, decode_blocks,
                            sreq.prompt_tokens + req.max_tokens // 2)
        plan.decode.breaker.on_placed(now)
        self.index.record_placement(plan.decode.worker_id, pending.hashes)
        self.affinity.record(req.tenant, req.affinity_key,
                             [w.worker_id for w in (plan.decode, plan.prefill) if w is not None])
        if plan.prefill is not None:
            plan.prefill.reserve(lease_id, now, uncached, math.ceil(uncached / bs))
            plan.prefill.breaker.on_placed(now)
            self.index.record_placement(plan.prefill.worker_id, pending.hashes)
        self._leases[lease_id] = _Lease(
            lease_id, req.tenant, plan.decode.worker_id,
            plan.prefill.worker_id if plan.prefill is not None else None,
            computing.queued_prefill_tokens() - uncached, uncached, req.max_tokens,
            now + self.config.placement_lease_ttl_s)
        self.admission.queue.fair_share.charge(req.tenant,
                                               len(req.prompt_token_ids) + req.max_tokens)
        self.metrics.decisions.labels("placed", plan.reason).inc()
        self.metrics.prompt_tokens.inc(sreq.prompt_tokens)
        self.metrics.predicted_cached_tokens.inc(sreq.prompt_tokens - uncached)
        return Placement(req.request_id, lease_id, plan.decode.worker_id, plan.decode.address,
                         plan.prefill.worker_id if plan.prefill is not None else None,
                         plan.prefill.address if plan.prefill is not None else None,
                         plan.predicted_ttft_s, sreq.prompt_tokens - uncached, plan.reason,
                         plan.disagg_reason)

    def _dispatch(self, now: float) -> None:
        """Serves the queue while workers have room, and refuses what can no longer make its
        deadline."""
        queue = self.admission.queue
        for item, reason in queue.expired(now):
            self._on_queued_outcome(
                self._reject(item.request_id, reason, f"waited {now - item.enqueued_at:.3f}s "
                             "in the admission queue", self._queue_wait_s(item.priority)))
        while (item := queue.peek()) is not None:
            plan = self._plan(item.payload, now)
            if isinstance(plan, Rejection):
                queue.remove(item)
                self._on_queued_outcome(plan)
                continue
            if plan is None or plan.saturated:
                return
            queue.remove(item)
            self.admission.observe_queue_time(item, now)
            if now + plan.predicted_ttft_s > item.deadline:
                self._on_queued_outcome(
                    self._reject(
                        item.request_id, RejectReason.DEADLINE,
                        f"predicted first token {plan.predicted_ttft_s:.3f}s from now misses "
                        "the deadline",
                        self._queue_wait_s(item.priority)))
                continue
            self._on_queued_outcome(self._commit(plan, item.payload, now))

    def release(self, lease_id: str, observed_ttft_s: float | None = None,
                output_tokens: int | None = None, failed_worker_id: str | None = None) -> None:
        """Ends a lease with what the gateway saw; KeyError for an unknown (or already expired)
        lease."""
        with self._lock:
            lease = self._leases.pop(lease_id)
            now = self._clock()
            self._unreserve(lease)
            for worker_id in (lease.decode_id, lease.prefill_id):
                worker = self._workers.get(worker_id) if worker_id is not None else None
                if worker is None:
                    continue
                if worker_id == failed_worker_id:
                    worker.breaker.record_failure(now)
                else:
                    worker.breaker.record_success()
            computing = lease.prefill_id or lease.decode_id
            if observed_ttft_s is not None and failed_worker_id is None:
                self.metrics.observed_ttft.labels(computing).observe(observed_ttft_s)
                self.predictor.observe(computing, lease.queued_ahead_tokens, lease.uncached_tokens,
                                       observed_ttft_s)
            if output_tokens is not None:
                # Admission charged max_tokens up front; settle to what the request really produced.
                self.admission.queue.fair_share.charge(lease.tenant,
                                                       output_tokens - lease.max_tokens)
            self._dispatch(now)

    def _unreserve(self, lease: _Lease) -> None:
        for worker_id in (lease.decode_id, lease.prefill_id):
            worker = self._workers.get(worker_id) if worker_id is not None else None
            if worker is not None:
                worker.unreserve(lease.lease_id)

    def tick(self) -> None:
        """Housekeeping to run every few hundred ms: reclaims leases whose gateway never released
        them, drops workers whose registration lease ran out, and serves or expires the queue."""
        with self._lock:
            now = self._clock()
            while self._leases:
                lease = next(iter(self._leases.values()))
                if lease.expires_at > now:
                    break
                del self._leases[lease.lease_id]
                self._unreserve(lease)
            for worker_id in [w.worker_id for w in self._workers.values() if not w.is_alive(now)]:
                self.remove_worker(worker_id)
            self._dispatch(now)

    # -- observability -----------------------------------------------------------------------------

    def stats(self) -> RouterStats:
        """Aggregate load per role, for the autoscaler (GetStats)."""
        with self._lock:
            now = self._clock()
            live = [w for w in self._workers.values() if w.is_alive(now)]
            pools = self._pools(live, now)
            served = tuple(replace(m, runtime_loras=self.runtime_loras.wanted(m.name))
                           for m in served_model_stats(self.config.served_models(), live))
            return RouterStats(pools, len(self.admission.queue), len(self._leases),
                               self.config.model, served[0].max_model_len,
                               served[0].lora_adapters, served)

    def pools_by_model(self) -> dict[str, dict[Role, PoolStats]]:
        """stats()'s pools for each served model's workers alone: behind one router each model's
        pools scale on their own load."""
        with self._lock:
            now = self._clock()
            live = [w for w in self._workers.values() if w.is_alive(now)]
            return {name: self._pools([w for w in live if w.model == name], now)
                    for name in self.config.served_models()}

    def _pools(self, live: list[WorkerState], now: float) -> dict[Role, PoolStats]:
        return pool_stats(live, now, self.limits)

    def _load_rows(self) -> list[WorkerLoadRow]:
        with self._lock:
            return load_rows(self._workers.values(), self._clock())
