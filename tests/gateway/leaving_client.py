"""A client that leaves mid-request: it posts a non-streamed request and closes the connection once
a given worker runs it, so the request is known to be admitted and unanswered when the client goes.
Shared by the disconnect tests (the decode side) and the prefill fault tests (the prefill side)."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from baton.services.common.process import ServiceProcess
from tests.launcher import metric

# A loaded test machine may be slow to start a request; only what happens after the client leaves is
# timed.
ADMIT_WITHIN_S = 30.0


async def leave_once_running(url: str, body: dict, worker: ServiceProcess,
                             poll_s: float = 0.05) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=ADMIT_WITHIN_S) as http:
        post = asyncio.create_task(http.post("/completions", json=body))
        deadline = time.monotonic() + ADMIT_WITHIN_S
        while metric(worker, "baton_num_requests_running") < 1:
            assert not post.done(), f"answered before it ran: {post.result().text}"
            assert time.monotonic() < deadline, "the request never ran"
            await asyncio.sleep(poll_s)
        assert not post.done(), "the request finished before the client could leave"
        post.cancel()
        with pytest.raises(asyncio.CancelledError):
            await post
