"""What the orchestrator tells the router on release: the observed TTFT (placement to first
token) only for the placement a fresh prefill produced the first token on, never for one that
recomputed a migrated stream, and never where no first token came; what it asks on each
migration (not the workers the stream broke on); and that a prefill worker that fails or misses its
deadline is answered by local prefill on the same placement, and named to the router."""
from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.gateway.handoff_client import PrefillFailed
from baton.services.gateway.orchestrator import (ChoiceProgress, ChoiceRequest, Orchestrator,
                                                 PrefillDeadline, Refused)
from baton.v1 import router_pb2, worker_pb2

LOST = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata())


class FakeRouter:
    def __init__(self) -> None:
        self.placed = 0
        self.releases: list[router_pb2.ReleaseRequest] = []
        self.excluded: list[list[str]] = []

    async def Place(self, request: router_pb2.PlaceRequest, metadata=()) -> router_pb2.Placement:
        self.placed += 1
        self.excluded.append(list(request.excluded_worker_ids))
        return router_pb2.Placement(request_id=request.request_id, lease_id=f"lease-{self.placed}",
                                    decode_worker_id=f"d{self.placed}", decode_address="unused",
                                    prefill_worker_id=f"p{self.placed}")

    async def Release(self, request: router_pb2.ReleaseRequest,
                      timeout: float) -> router_pb2.ReleaseResponse:
        self.releases.append(request)
        return router_pb2.ReleaseResponse()


def scripted(*attempts: tuple[int, bool]):
    """An _attempt that yields `tokens` messages per placement, then breaks the stream if `lost`."""
    plan = iter(attempts)

    async def attempt(choice, placement, tokens,
                      local) -> AsyncIterator[worker_pb2.GenerateResponse]:
        count, lost = next(plan)
        for i in range(count):
            last = i == count - 1 and not lost
            yield worker_pb2.GenerateResponse(token_ids=[i + 1], finished=last)
        if lost:
            raise LOST

    return attempt


async def serve(*attempts: tuple[int, bool], router: FakeRouter | None = None,
                max_migrations: int = 1) -> list[router_pb2.ReleaseRequest]:
    orchestrator = Orchestrator("127.0.0.1:1", max_migrations, PrefillDeadline(3.0, 10.0))
    orchestrator.router = router = router or FakeRouter()
    orchestrator._attempt = scripted(*attempts)
    params = SamplingParams(max_tokens=4)
    choice = ChoiceRequest("r", [1, 2, 3], params, "t", 0, "", None, None)
    try:
        async for _ in orchestrator.run(choice, ChoiceProgress()):
            pass
    except grpc.aio.AioRpcError:
        pass
    return router.releases


def ttfts(releases: list[router_pb2.ReleaseRequest]) -> list[int | None]:
    return [r.observed_ttft_ms if r.HasField("observed_ttft_ms") else None for r in releases]


@pytest.mark.asyncio
async def test_a_clean_request_reports_its_ttft_in_ms() -> None:
    [release] = await serve((4, False))
    assert release.HasField("observed_ttft_ms") and 0 <= release.observed_ttft_ms < 1000
    assert (release.output_tokens, release.failed_worker_id) == (4, "")


@pytest.mark.asyncio
async def test_a_migrated_stream_reports_only_the_first_placements_ttft() -> None:
    first, moved = await serve((2, True), (2, False))
    assert (first.failed_worker_id, moved.failed_worker_id) == ("d1", "")
    assert first.HasField("observed_ttft_ms") and not moved.HasField("observed_ttft_ms")


@pytest.mark.asyncio
async def test_no_ttft_without_a_first_token_on_the_placement() -> None:
    # Lost before any token: the next placement prefills afresh, its first token a clean sample.
    lost, fresh = await serve((0, True), (3, False))
    assert ttfts([lost]) == [None] and fresh.HasField("observed_ttft_ms")
    # Lost before any token with no migration left: nothing to report.
    assert ttfts(await serve((0, True), (0, True))) == [None, None]


@pytest.mark.asyncio
async def test_each_migration_excludes_every_worker_the_stream_broke_on() -> None:
    router = FakeRouter()
    await serve((1, True), (1, True), (2, False), router=router, max_migrations=2)
    assert router.excluded == [[], ["d1"], ["d1", "d2"]]


def prefill_failing(code: grpc.StatusCode, seen: list[tuple[str, bool]]):
    """An _attempt whose remote prefill fails with `code`; local prefill answers one token."""

    async def attempt(choice, placement, tokens,
                      local) -> AsyncIterator[worker_pb2.GenerateResponse]:
        seen.append((placement.lease_id, local))
        if not local:
            raise PrefillFailed(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "stalled")
        yield worker_pb2.GenerateResponse(token_ids=[7], finished=True)

    return attempt


@pytest.mark.asyncio
async def test_a_failed_prefill_falls_back_to_local_prefill_and_names_the_prefill_worker() -> None:
    orchestrator = Orchestrator("127.0.0.1:1", 1, PrefillDeadline(3.0, 10.0))
    orchestrator.router = router = FakeRouter()
    seen: list[tuple[str, bool]] = []
    orchestrator._attempt = prefill_failing(grpc.StatusCode.DEADLINE_EXCEEDED, seen)
    choice = ChoiceRequest("r", [1, 2, 3], SamplingParams(max_tokens=1), "t", 0, "", None, None)
    tokens = [t async for m in orchestrator.run(choice, ChoiceProgress()) for t in m.token_ids]
    assert tokens == [7] and seen == [("lease-1", False), ("lease-1", True)]
    [release] = router.releases
    assert release.failed_worker_id == "p1"
    # a refusal by the prefill worker (a bad request) is an answer, not a fault to route around
    orchestrator._attempt = prefill_failing(grpc.StatusCode.INVALID_ARGUMENT, [])
    with pytest.raises(Refused) as refused:
        async for _ in orchestrator.run(choice, ChoiceProgress()):
            pass
    assert refused.value.status == 400


def test_the_prefill_deadline_is_a_multiple_of_the_ttft_slo_or_the_default() -> None:
    deadline = PrefillDeadline(slo_factor=3.0, default_s=10.0)
    assert (deadline.for_slo(500.0), deadline.for_slo(None)) == (1.5, 10.0)
