"""Where a request would be placed now, over the router's current view of its workers: the decode
worker, the prefill worker when the prompt is worth handing off (conditional disaggregation), and
the predicted time to first token; or a refusal when its TPOT SLO leaves no decode worker. A plan
reserves nothing: the router commits it (services/router/router.py:Router._commit) or queues the
request."""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from baton.services.common.messages.router import DisaggReason, PlaceRequest
from baton.services.common.roles import Role
from baton.services.router.admission import Admission
from baton.services.router.affinity_keys import AffinityKeys
from baton.services.router.config import RouterConfig
from baton.services.router.disaggregation import DisaggInputs, DisaggPolicy, decide
from baton.services.router.plugins.base import SchedulingRequest
from baton.services.router.plugins.picker import Picker
from baton.services.router.prefix_index import PrefixIndex
from baton.services.router.rejections import RejectReason, Rejection
from baton.services.router.tier_value import tier_blocks
from baton.services.router.tpot_predictor import decode_join_wait_s, predict_tpot_s
from baton.services.router.ttft_predictor import TTFTPredictor
from baton.services.router.worker_state import WorkerState


@dataclass
class Plan:
    """Where a request would go now; nothing is reserved until the router commits it."""
    sreq: SchedulingRequest
    decode: WorkerState
    prefill: WorkerState | None
    disagg_reason: DisaggReason
    predicted_ttft_s: float
    reason: str
    saturated: bool

    @property
    def computing(self) -> WorkerState:
        return self.prefill if self.prefill is not None else self.decode


@dataclass
class Pending:
    """A request being placed (or waiting in the queue), with what placing it needs."""
    request: PlaceRequest
    hashes: list[int]
    slo_s: float | None
    tpot_slo_s: float | None = None


class Planner:
    def __init__(self, config: RouterConfig, index: PrefixIndex, predictor: TTFTPredictor,
                 admission: Admission, affinity: AffinityKeys) -> None:
        self.config = config
        self.index = index
        self.affinity = affinity
        self.predictor = predictor
        self.admission = admission
        self.disagg_policy = DisaggPolicy(config.max_local_prefill_tokens,
                                          config.max_prefill_queue_s,
                                          config.local_prefill_kv_headroom)

    def plan(self, pending: Pending, candidates: Iterable[WorkerState], decode_picker: Picker,
             prefill_picker: Picker, now: float) -> Plan | Rejection | None:
        """The decode worker, and the prefill worker for a remote prefill, the pickers choose among
        the candidates the request's TPOT SLO leaves; a Rejection when that SLO leaves no decode
        worker; None when no worker can take it at all."""
        req = pending.request
        device = self.index.match_lengths(pending.hashes)
        sreq = SchedulingRequest(req.request_id, len(req.prompt_token_ids),
                                 self.config.block_size, now, device, req.tenant, req.priority,
                                 self.affinity.workers_for(req.tenant, req.affinity_key),
                                 lora_name=req.lora_name,
                                 tier_blocks=self._tier_blocks(pending, device, candidates))
        workers, tpot, refusal = self._decode_fit(pending, candidates)
        if refusal is not None:
            return refusal
        decode_pick = decode_picker.pick(sreq, workers)
        if decode_pick is None:
            return None
        prefill_pick = prefill_picker.pick(sreq, workers)
        prefill_queue_s = None
        if prefill_pick is not None:
            prefill_queue_s = self.predictor.predict(prefill_pick.worker.worker_id,
                                                     prefill_pick.worker.queued_prefill_tokens(), 0)
        decode = decode_pick.worker
        decode_queue_s = self.predictor.predict(decode.worker_id, decode.queued_prefill_tokens(), 0)
        decision = decide(
            DisaggInputs(sreq.uncached_tokens(decode.worker_id), decode.free_kv_blocks(),
                         self.config.block_size, prefill_queue_s, decode_queue_s),
            self.disagg_policy)
        prefill = prefill_pick.worker if decision.remote and prefill_pick is not None else None
        computing = prefill if prefill is not None else decode
        predicted = self.predictor.predict(computing.worker_id, computing.queued_prefill_tokens(),
                                           sreq.prefill_work_tokens(computing.worker_id))
        if prefill is None or not pending.request.first_token_at_prefill:
            predicted += decode_join_wait_s(decode, tpot.get(decode.worker_id))
        saturated = decode_pick.reason == "all_saturated" or (
            prefill is not None and prefill_pick is not None and
            prefill_pick.reason == "all_saturated")
        return Plan(sreq, decode, prefill, decision.reason, predicted, decode_pick.reason,
                    saturated)

    def _tier_blocks(self, pending: Pending, device: dict[str, int],
                     candidates: Iterable[WorkerState]) -> dict[str, float]:
        runs = self.index.tier_runs(pending.hashes, device)
        if not runs:
            return {}
        workers = {w.worker_id: w for w in candidates}
        return tier_blocks(runs, workers, self.predictor, self.config.block_size)

    def _decode_fit(
        self, pending: Pending, candidates: Iterable[WorkerState]
    ) -> tuple[list[WorkerState], dict[str, float], Rejection | None]:
        """The workers a plan may use: not those the request is excluded from, and not decode
        workers whose predicted TPOT with this request misses its TPOT SLO; when the SLO leaves
        none (while some had a prediction) the request is refused now, since waiting would not
        shrink the batches it would join any sooner than the queue's deadline. Also the predicted
        TPOT of every decode worker that has one."""
        req, slo = pending.request, pending.tpot_slo_s
        # A worker a stream broke on may still look healthy (its breaker counts one failure, and its
        # last stats are fresh), and a migration placed back there breaks again.
        allowed = [w for w in candidates if w.worker_id not in req.excluded_worker_ids]
        tpot: dict[str, float] = {}
        for w in allowed:
            if w.role is not Role.PREFILL and (t := predict_tpot_s(w, len(req.prompt_token_ids),
                                                                   req.max_tokens)):
                tpot[w.worker_id] = t
        # Decode batches fill from whoever comes first, so lower priorities stop joining sooner: a
        # batch's last rows stay for the higher ones, as the router queue serves them first.
        headroom = self._tpot_headroom(req.priority)
        limit = slo * headroom if slo is not None else math.inf
        workers = [w for w in allowed if tpot.get(w.worker_id, 0.0) <= limit]
        if tpot and not any(w.role is not Role.PREFILL for w in workers):
            best = min(tpot.values())
            refusal = self.admission.reject(
                req.request_id, RejectReason.TPOT_SLO,
                f"predicted time per output token {best * 1e3:.1f}ms on the least loaded decode "
                f"worker exceeds the SLO of {slo * 1e3:.1f}ms less {1 - headroom:.0%} headroom",
                best * req.max_tokens)
            return workers, tpot, refusal
        return workers, tpot, None

    def _tpot_headroom(self, priority: int) -> float:
        c = self.config
        return c.sheddable_tpot_slo_headroom if priority < 0 else \
            c.critical_tpot_slo_headroom if priority > 0 else c.tpot_slo_headroom
