"""The router's messages and their wire forms (services/common/wire/router.py): every field of a
message the router reads arrives, what the gateway sends survives the trip, and a field added to a
message without a mapping shows up here."""
from __future__ import annotations

import pytest

from baton.services.common.decode_cost import DecodeCostFit
from baton.services.common.limits import MAX_PROMPT_TOKENS
from baton.services.common.messages.router import (DisaggReason, ModelStats, Placement,
                                                   PlaceRequest, PoolStats, Release, RouterStats)
from baton.services.common.messages.worker import EventKind, KVEvent, KVEventBatch, KVSnapshot
from baton.services.common.roles import Role
from baton.services.common.wire.router import (kv_events_from_proto, kv_snapshot_from_proto,
                                               load_report_from_proto, place_request_from_proto,
                                               place_request_to_proto, placement_to_proto,
                                               release_from_proto, release_to_proto,
                                               router_stats_from_proto, router_stats_to_proto)
from baton.v1 import router_pb2 as rpb
from baton.v1 import worker_pb2 as wpb


def _unset(message) -> list[str]:
    """The fields of a message left at their default (so a test that sets every field can tell)."""
    return sorted(name for name, field in type(message).DESCRIPTOR.fields_by_name.items()
                  if (field.has_presence and not message.HasField(name))
                  or (not field.has_presence and getattr(message, name) == field.default_value))


def _place_request() -> PlaceRequest:
    return PlaceRequest("r-1", [5, 6, 7], tenant="acme", cache_salt="salt", priority=-3,
                        max_tokens=64, ttft_slo_s=0.25, tpot_slo_s=0.04,
                        excluded_worker_ids=frozenset({"d2", "d1"}), first_token_at_prefill=True,
                        affinity_key="conversation-7", lora_name="support-bot", model="coder-7b")


def test_a_place_request_survives_the_trip_with_every_field() -> None:
    message = place_request_to_proto(_place_request())
    assert _unset(message) == []
    assert place_request_from_proto(message) == _place_request()
    # the same request makes the same message, whatever the set's order
    assert list(message.excluded_worker_ids) == ["d1", "d2"]


def test_a_place_request_without_slos_or_salt_leaves_them_unset() -> None:
    message = place_request_to_proto(PlaceRequest("r", [1]))
    assert not message.HasField("ttft_slo_ms") and not message.HasField("tpot_slo_ms")
    assert message.cache_salt == "" and place_request_from_proto(message) == PlaceRequest("r", [1])


def test_slos_travel_in_whole_milliseconds() -> None:
    # what came as milliseconds goes back as the same milliseconds
    for ms in (1, 290, 300, 4095, 86_400_000):
        message = place_request_to_proto(PlaceRequest("r", [1], ttft_slo_s=ms / 1000))
        assert message.ttft_slo_ms == ms


def test_a_prompt_longer_than_any_worker_accepts_is_refused_before_it_is_copied() -> None:
    with pytest.raises(ValueError, match="at most"):
        place_request_from_proto(rpb.PlaceRequest(request_id="r",
                                                  prompt_token_ids=[1] * (MAX_PROMPT_TOKENS + 1)))


def test_a_release_survives_the_trip_and_absent_fields_stay_unset() -> None:
    full = Release("lease", observed_ttft_s=0.123, output_tokens=0, failed_worker_id="d0")
    message = release_to_proto(full)
    assert _unset(message) == [] and message.output_tokens == 0
    assert release_from_proto(message) == full
    bare = release_to_proto(Release("lease"))
    assert not bare.HasField("observed_ttft_ms") and not bare.HasField("output_tokens")
    assert release_from_proto(bare) == Release("lease")


def test_a_placement_names_its_mode_and_reasons() -> None:
    remote = Placement("r", "lease", "d0", "10.0.0.1:1", "p0", "10.0.0.2:1", 0.0125, 32, "load",
                       DisaggReason.LONG_PREFILL)
    message = placement_to_proto(remote)
    assert _unset(message) == []
    assert (message.prefill_mode, message.reason, message.disaggregation_reason,
            message.predicted_ttft_ms) == (rpb.PREFILL_MODE_REMOTE, rpb.PLACEMENT_REASON_LOAD,
                                           "long_prefill", 12)
    local = placement_to_proto(Placement("r", "lease", "d0", "a", None, None, 1e9, 0,
                                         "prefix_affinity", DisaggReason.SHORT_PREFILL))
    assert (local.prefill_mode, local.prefill_worker_id, local.prefill_address,
            local.predicted_ttft_ms) == (rpb.PREFILL_MODE_LOCAL, "", "", 2**32 - 1)


def test_router_stats_survive_the_trip_with_every_pool() -> None:
    pool = PoolStats(workers=3, queued_prefill_tokens=100, inflight_requests=7,
                     mean_kv_utilization=0.5, saturated=1)
    served = (ModelStats("m", 4096, ("coder", "support-bot"), 2, (("coder", "/adapters/c"),)),
              ModelStats("other", 512, (), 1))
    stats = RouterStats({Role.DECODE: pool}, queued_requests=2, leases=9, model="m",
                        max_model_len=4096, lora_adapters=("coder", "support-bot"),
                        served_models=served)
    message = router_stats_to_proto(stats)
    [wire] = message.pools
    assert _unset(wire) == [] and _unset(message) == [] and _unset(message.served_models[0]) == []
    assert (wire.role, wire.workers, wire.saturated_workers) == (rpb.WORKER_ROLE_DECODE, 3, 1)
    assert router_stats_from_proto(message) == stats
    # a pool of a role this side does not know (a newer router's) is left out
    message.pools.add(role=99, workers=1)
    assert router_stats_from_proto(message) == stats


def _worker_stats() -> wpb.WorkerStats:
    return wpb.WorkerStats(worker_id="w", role=wpb.ROLE_DECODE, timestamp_unix_ms=1_700_000_000_123,
                           num_running=3, num_waiting=4, kv_blocks_used=5, kv_blocks_total=600,
                           prefill_tokens_queued=700, recent_step_ms=[1.5], num_leases=2,
                           draining=True, block_size=16, model="m", prefill_tokens_per_s=2048.0,
                           decode_step_ms_base=10.0, decode_step_ms_per_sequence=0.5,
                           decode_step_ms_per_ktoken=0.25, decode_step_samples=32, decode_rows=8,
                           decode_context_tokens=9000, max_model_len=4096,
                           decode_tokens_per_row_step=2.5,
                           lora_adapters=["coder", "support-bot"], loaded_loras=["coder"],
                           host_load_seconds_per_block=0.5, disk_load_seconds_per_block=2.0)


READ = {"worker_id", "role", "timestamp_unix_ms", "num_running", "num_waiting", "kv_blocks_used",
        "kv_blocks_total", "prefill_tokens_queued", "draining", "block_size", "model",
        "prefill_tokens_per_s", "decode_step_ms_base", "decode_step_ms_per_sequence",
        "decode_step_ms_per_ktoken", "decode_step_samples", "decode_rows", "decode_context_tokens",
        "max_model_len", "lora_adapters", "loaded_loras", "host_load_seconds_per_block",
        "disk_load_seconds_per_block", "decode_tokens_per_row_step"}
# WorkerStats fields the router has no use for (the worker's own dashboards read them).
NOT_READ = {"recent_step_ms", "num_leases"}


def test_a_load_report_keeps_every_field_the_router_reads() -> None:
    stats = _worker_stats()
    assert _unset(stats) == []
    report = load_report_from_proto(stats)
    assert (report.worker_id, report.role, report.model, report.block_size) == (
        "w", Role.DECODE, "m", 16)
    assert report.timestamp_s == pytest.approx(1_700_000_000.123)
    assert (report.num_running, report.num_waiting, report.kv_blocks_used, report.kv_blocks_total,
            report.prefill_tokens_queued, report.draining) == (3, 4, 5, 600, 700, True)
    assert (report.prefill_tokens_per_s, report.decode_rows, report.decode_context_tokens,
            report.max_model_len) == (2048.0, 8, 9000, 4096)
    assert report.decode_cost == DecodeCostFit(0.01, 0.0005, 0.25e-6, 32, 2.5)
    assert (report.lora_adapters, report.loaded_loras) == ({"coder", "support-bot"}, {"coder"})
    assert (report.host_load_seconds_per_block, report.disk_load_seconds_per_block) == (0.5, 2.0)
    # a field added to WorkerStats is either read above or named as not the router's
    assert set(wpb.WorkerStats.DESCRIPTOR.fields_by_name) == READ | NOT_READ


def test_a_worker_without_a_fit_or_a_known_role_reads_as_such() -> None:
    report = load_report_from_proto(wpb.WorkerStats(worker_id="w", role=wpb.ROLE_UNSPECIFIED))
    assert report.decode_cost is None and report.role is None
    # A fit from a worker that predates decode_tokens_per_row_step: one token a step.
    older = load_report_from_proto(wpb.WorkerStats(decode_step_samples=5, decode_step_ms_base=2))
    assert older.decode_cost.tokens_per_row_step == 1.0


def test_kv_events_and_snapshots_arrive_typed() -> None:
    batch = wpb.KVEventBatch(worker_id="w", gap=True, events=[
        wpb.KVEvent(sequence=1, kind=wpb.KVEvent.KIND_STORED, block_hashes=[11, 12]),
        wpb.KVEvent(sequence=2, kind=wpb.KVEvent.KIND_CLEARED)])
    assert kv_events_from_proto(batch) == KVEventBatch(
        "w", (KVEvent(1, EventKind.STORED, (11, 12)), KVEvent(2, EventKind.CLEARED, ())), gap=True)
    snapshot = wpb.KVSnapshot(worker_id="w", sequence=7, block_hashes=[1, 2], block_size=16,
                              host_block_hashes=[3], disk_block_hashes=[4, 5])
    assert kv_snapshot_from_proto(snapshot) == KVSnapshot("w", 7, (1, 2), (3,), (4, 5))
    with pytest.raises(ValueError):
        kv_events_from_proto(wpb.KVEventBatch(events=[wpb.KVEvent(sequence=1)]))
