"""A client that goes away mid-stream has its request aborted and its KV blocks freed on the workers
within a second; a non-streamed request whose client leaves is abandoned too."""
from __future__ import annotations

import time

import httpx
import pytest

from tests.launcher import blocks_all_free, metric


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
    with httpx.Client(base_url=colocated.url, timeout=30) as http:
        if stream:
            with http.stream("POST", "/completions", json=body) as response:
                lines = response.iter_lines()
                while sum(1 for _ in zip(range(5), lines)) < 5:
                    pass
                assert metric(worker, "baton_num_requests_running") == 1
        else:
            with pytest.raises(httpx.ReadTimeout):
                http.post("/completions", json=body, timeout=1.0)
    assert _wait_free(colocated, within=1.0 if stream else 1.5) < 1.5
    assert metric(worker, "baton_num_requests_running") == 0
