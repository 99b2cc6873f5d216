"""A client that goes away mid-stream has its request aborted and its KV blocks freed on the workers
within a second; a non-streamed request whose client leaves is abandoned too (counted as status
499, with no traceback)."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.gateway.leaving_client import leave_once_running
from tests.launcher import blocks_all_free, metric, wait_for



def _wait_free(stack, within: float) -> float:
    start = time.monotonic()
    while not blocks_all_free(stack):
        assert time.monotonic() - start < within, "blocks still held"
        time.sleep(0.05)
    return time.monotonic() - start


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_frees_blocks_within_a_second(colocated, model, stream):
    body = {
        "model": model.name, "prompt": "tell me everything", "max_tokens": 1500, "temperature": 0,
        "ignore_eos": True, "stream": stream
    }
    worker = colocated.workers()[0]
    if stream:
        with httpx.Client(base_url=colocated.url, timeout=30) as http:
            with http.stream("POST", "/completions", json=body) as response:
                assert response.status_code == 200, response.read()
                lines = response.iter_lines()
                while sum(1 for _ in zip(range(5), lines)) < 5:
                    pass
                assert metric(worker, "baton_num_requests_running") == 1
    else:
        closed_before = colocated.gateway_metric("baton_gateway_requests_total", status="499")
        asyncio.run(leave_once_running(colocated.url, body, worker))
    assert _wait_free(colocated, within=1.0 if stream else 1.5) < 1.5
    assert metric(worker, "baton_num_requests_running") == 0
    if not stream:
        closed = colocated.gateway_metric("baton_gateway_requests_total", status="499")
        assert closed == closed_before + 1
        assert "CancelledError" not in colocated.gateway.log(), "the abandoned request raised"


def test_disconnected_streams_leave_nothing_in_flight(colocated, model):
    """Each stream cut mid-way used to stay counted in baton_gateway_requests_in_flight: Starlette
    cancels a cut stream's body in a cancel scope that also cancelled the cleanup's own await."""
    body = {
        "model": model.name, "prompt": "tell me everything", "max_tokens": 1500, "temperature": 0,
        "ignore_eos": True, "stream": True
    }
    for _ in range(5):
        with httpx.Client(base_url=colocated.url, timeout=30) as http:
            with http.stream("POST", "/completions", json=body) as response:
                assert response.status_code == 200, response.read()
                lines = response.iter_lines()
                while sum(1 for _ in zip(range(3), lines)) < 3:
                    pass
    wait_for(lambda: colocated.gateway_metric("baton_gateway_requests_in_flight") == 0,
             timeout=5, what="no request in flight")
    _wait_free(colocated, within=5.0)
