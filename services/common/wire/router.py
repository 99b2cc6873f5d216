"""The Router contract's messages (router.proto) and the worker messages the router reads
(worker.proto's WorkerStats, KVEventBatch, KVSnapshot) to and from their plain values
(services/common/messages/). The one place they convert: the gateway encodes its Place and Release
calls here, the router decodes them and encodes its answers, and the router's worker feeds decode
what the workers report."""
from __future__ import annotations

from baton.services.common.decode_cost import DecodeCostFit
from baton.services.common.limits import MAX_PROMPT_TOKENS
from baton.services.common.messages.router import (ModelStats, Placement, PlaceRequest, PoolStats,
                                                   Release, RouterStats)
from baton.services.common.messages.worker import (EventKind, KVEvent, KVEventBatch, KVSnapshot,
                                                   LoadReport, Medium)
from baton.services.common.roles import Role
from baton.v1 import router_pb2 as rpb
from baton.v1 import worker_pb2 as wpb

PLACEMENT_REASONS = {"prefix_affinity": rpb.PLACEMENT_REASON_PREFIX_AFFINITY,
                     "load": rpb.PLACEMENT_REASON_LOAD,
                     "all_saturated": rpb.PLACEMENT_REASON_ALL_SATURATED}


def _ms(seconds: float) -> int:
    """Seconds as the wire's whole milliseconds (a value that came as milliseconds goes back
    unchanged)."""
    return round(seconds * 1000)


def place_request_to_proto(req: PlaceRequest) -> rpb.PlaceRequest:
    # sorted: a set has no order of its own, and the same request should make the same message
    message = rpb.PlaceRequest(request_id=req.request_id, prompt_token_ids=req.prompt_token_ids,
                               tenant=req.tenant, cache_salt=req.cache_salt or "",
                               priority=req.priority, max_tokens=req.max_tokens,
                               excluded_worker_ids=sorted(req.excluded_worker_ids),
                               first_token_at_prefill=req.first_token_at_prefill,
                               affinity_key=req.affinity_key,
                               lora_name=req.lora_name or "", model=req.model or "")
    if req.ttft_slo_s is not None:
        message.ttft_slo_ms = _ms(req.ttft_slo_s)
    if req.tpot_slo_s is not None:
        message.tpot_slo_ms = _ms(req.tpot_slo_s)
    return message


def place_request_from_proto(request: rpb.PlaceRequest) -> PlaceRequest:
    """ValueError for a prompt longer than any worker accepts, before it is copied."""
    if len(request.prompt_token_ids) > MAX_PROMPT_TOKENS:
        raise ValueError(
            f"prompt has {len(request.prompt_token_ids)} tokens; at most {MAX_PROMPT_TOKENS} "
            "are accepted")
    return PlaceRequest(
        request_id=request.request_id, prompt_token_ids=list(request.prompt_token_ids),
        tenant=request.tenant, cache_salt=request.cache_salt or None, priority=request.priority,
        max_tokens=request.max_tokens,
        ttft_slo_s=request.ttft_slo_ms / 1000 if request.HasField("ttft_slo_ms") else None,
        tpot_slo_s=request.tpot_slo_ms / 1000 if request.HasField("tpot_slo_ms") else None,
        excluded_worker_ids=frozenset(request.excluded_worker_ids),
        first_token_at_prefill=request.first_token_at_prefill,
        affinity_key=request.affinity_key,
        lora_name=request.lora_name or None, model=request.model or None)


def placement_to_proto(p: Placement) -> rpb.Placement:
    remote = p.prefill_worker_id is not None
    return rpb.Placement(
        request_id=p.request_id, lease_id=p.lease_id, decode_worker_id=p.decode_worker_id,
        decode_address=p.decode_address, prefill_worker_id=p.prefill_worker_id or "",
        prefill_address=p.prefill_address or "",
        prefill_mode=rpb.PREFILL_MODE_REMOTE if remote else rpb.PREFILL_MODE_LOCAL,
        disaggregation_reason=p.disagg_reason.value,
        reason=PLACEMENT_REASONS.get(p.reason, rpb.PLACEMENT_REASON_UNSPECIFIED),
        predicted_ttft_ms=min(2**32 - 1, round(p.predicted_ttft_s * 1000)),
        predicted_cached_tokens=p.cached_tokens)


def release_to_proto(release: Release) -> rpb.ReleaseRequest:
    message = rpb.ReleaseRequest(lease_id=release.lease_id,
                                 failed_worker_id=release.failed_worker_id or "")
    if release.output_tokens is not None:
        message.output_tokens = release.output_tokens
    if release.observed_ttft_s is not None:
        message.observed_ttft_ms = _ms(release.observed_ttft_s)
    return message


def release_from_proto(request: rpb.ReleaseRequest) -> Release:
    return Release(
        lease_id=request.lease_id,
        observed_ttft_s=(request.observed_ttft_ms / 1000
                         if request.HasField("observed_ttft_ms") else None),
        output_tokens=request.output_tokens if request.HasField("output_tokens") else None,
        failed_worker_id=request.failed_worker_id or None)


def router_stats_to_proto(stats: RouterStats) -> rpb.RouterStats:
    pools = [
        rpb.PoolStats(role=int(role), workers=p.workers,
                      queued_prefill_tokens=p.queued_prefill_tokens,
                      inflight_requests=p.inflight_requests,
                      mean_kv_utilization=p.mean_kv_utilization, saturated_workers=p.saturated)
        for role, p in stats.pools.items()
    ]
    return rpb.RouterStats(pools=pools, queued_requests=stats.queued_requests,
                           leases=stats.leases, model=stats.model,
                           max_model_len=stats.max_model_len,
                           lora_adapters=list(stats.lora_adapters),
                           served_models=[rpb.ServedModel(name=m.name,
                                                          max_model_len=m.max_model_len,
                                                          lora_adapters=list(m.lora_adapters),
                                                          workers=m.workers,
                                                          runtime_loras=_runtime_loras(m))
                                          for m in stats.served_models])


def _runtime_loras(model: ModelStats) -> list[rpb.RuntimeLoRA]:
    return [rpb.RuntimeLoRA(name=name, path=path) for name, path in model.runtime_loras]


def router_stats_from_proto(stats: rpb.RouterStats) -> RouterStats:
    """A pool of a role this side does not know is left out."""
    pools = {role: PoolStats(p.workers, p.queued_prefill_tokens, p.inflight_requests,
                             p.mean_kv_utilization, p.saturated_workers)
             for p in stats.pools if (role := _role(p.role)) is not None}
    served = tuple(ModelStats(m.name, m.max_model_len, tuple(m.lora_adapters), m.workers,
                              tuple((r.name, r.path) for r in m.runtime_loras))
                   for m in stats.served_models)
    return RouterStats(pools, stats.queued_requests, stats.leases, stats.model,
                       stats.max_model_len, tuple(stats.lora_adapters), served)


def _role(value: int) -> Role | None:
    try:
        return Role(value)
    except ValueError:  # unspecified, or newer than this router
        return None


def load_report_from_proto(stats: wpb.WorkerStats) -> LoadReport:
    samples = stats.decode_step_samples
    cost = None if not samples else DecodeCostFit(
        stats.decode_step_ms_base / 1e3, stats.decode_step_ms_per_sequence / 1e3,
        stats.decode_step_ms_per_ktoken / 1e6, samples,
        # 0 from a worker that predates the field: one token per step
        stats.decode_tokens_per_row_step or 1.0)
    return LoadReport(timestamp_s=stats.timestamp_unix_ms / 1000.0, num_running=stats.num_running,
                      num_waiting=stats.num_waiting, kv_blocks_used=stats.kv_blocks_used,
                      kv_blocks_total=stats.kv_blocks_total,
                      prefill_tokens_queued=stats.prefill_tokens_queued, draining=stats.draining,
                      decode_cost=cost, decode_rows=stats.decode_rows,
                      decode_context_tokens=stats.decode_context_tokens,
                      max_model_len=stats.max_model_len,
                      worker_id=stats.worker_id, role=_role(stats.role), model=stats.model,
                      block_size=stats.block_size,
                      prefill_tokens_per_s=stats.prefill_tokens_per_s,
                      lora_adapters=frozenset(stats.lora_adapters),
                      loaded_loras=frozenset(stats.loaded_loras),
                      host_load_seconds_per_block=stats.host_load_seconds_per_block,
                      disk_load_seconds_per_block=stats.disk_load_seconds_per_block)


def kv_events_from_proto(batch: wpb.KVEventBatch) -> KVEventBatch:
    """ValueError for an event of a kind or medium this router does not know."""
    events = tuple(KVEvent(e.sequence, EventKind(e.kind), tuple(e.block_hashes), Medium(e.medium))
                   for e in batch.events)
    return KVEventBatch(batch.worker_id, events, batch.gap)


def kv_snapshot_from_proto(snapshot: wpb.KVSnapshot) -> KVSnapshot:
    return KVSnapshot(snapshot.worker_id, snapshot.sequence, tuple(snapshot.block_hashes),
                      tuple(snapshot.host_block_hashes), tuple(snapshot.disk_block_hashes))
