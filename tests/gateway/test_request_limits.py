"""What a request's body may cost the gateway: the API key is checked before the body is read; a
body over --max-request-body-bytes is a 413 before it is read (by Content-Length, or as a chunked
body's bytes arrive); nesting deeper than --max-json-depth is a 400, not a RecursionError's 500; and
a long prompt is tokenized off the event loop. A 50 MB body used to freeze the gateway for over a
minute and grow it by gigabytes."""
from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from baton.services.gateway.body import nesting_depth

AUTH = {"Authorization": "Bearer sk-alpha", "Content-Type": "application/json"}
CAP = 4 * 1024 * 1024  # the default --max-request-body-bytes
DEPTH = 128  # the default --max-json-depth


@pytest.fixture(scope="module")
def http(disaggregated):
    with httpx.Client(base_url=disaggregated.url, timeout=30) as client:
        yield client


def _big_body(size: int) -> bytes:
    return json.dumps({"prompt": "x" * size, "max_tokens": 1}).encode()


def _chunks(body: bytes) -> Iterator[bytes]:  # httpx sends an iterator chunked
    for start in range(0, len(body), 64 * 1024):
        yield body[start:start + 64 * 1024]


def test_without_a_key_nothing_is_read(http):
    for body in (b'{"prompt": ', b"[" * 10_000, _big_body(CAP)):
        response = http.post("/completions", content=body,
                             headers={"Content-Type": "application/json"})
        assert response.status_code == 401, response.text[:300]
        assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_cap_is_a_413(http, chunked):
    body = _big_body(CAP)
    response = http.post("/completions", content=_chunks(body) if chunked else body, headers=AUTH)
    assert response.status_code == 413, response.text[:300]
    assert response.json()["error"]["code"] == "request_too_large"
    assert response.headers["connection"] == "close"  # the unread rest is not drained


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_nesting_is_checked_before_parsing(http):
    for depth in (DEPTH + 1, 100_000):
        response = http.post("/completions", headers=AUTH,
                             content=f'{{"prompt": "hi", "stop": {_nested(depth - 1)}}}')
        assert response.status_code == 400, response.text[:300]
        error = response.json()["error"]
        assert error["code"] == "invalid_json" and f"nests arrays and objects {depth} deep" in \
            error["message"]
    # at the limit the body is parsed, and refused for what it says
    response = http.post("/completions", headers=AUTH,
                         content=f'{{"prompt": "hi", "stop": {_nested(DEPTH - 1)}}}')
    assert response.status_code == 400 and response.json()["error"]["param"].startswith("stop")


def test_nesting_depth_counts_no_bracket_inside_a_string():
    assert [nesting_depth(text) for text in (b"1", b'"[[{"', b"[]", b"[[], {}]")] == [0, 0, 1, 2]
    assert nesting_depth(rb'{"a": [1, {"b": "]]\"[[{\\"}], "c": "\\"}') == 3
    assert nesting_depth(b"[" * 100_000 + b"]" * 100_000) == 100_000


def _post_while_probing(stack, post) -> tuple[httpx.Response, float, list[float]]:
    """Runs `post` on a thread and probes /health meanwhile (ten times at least): the response, the
    post's seconds and each probe's latency."""
    result: dict[str, object] = {}

    def run() -> None:
        start = time.monotonic()
        result["response"] = post()
        result["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    latencies = []
    with httpx.Client(timeout=30) as probe:
        thread.start()
        while thread.is_alive() or len(latencies) < 10:
            start = time.monotonic()
            assert probe.get(stack.url.removesuffix("/v1") + "/health").status_code == 200
            latencies.append(time.monotonic() - start)
            time.sleep(0.01)
    thread.join()
    return result["response"], result["seconds"], latencies


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_50_mb_body_is_refused_at_once_and_costs_no_memory(http, disaggregated, chunked):
    gateway = psutil.Process(disaggregated.gateway.process.pid)
    idle = gateway.memory_info().rss
    body = _big_body(50 * 1024 * 1024)
    response, seconds, latencies = _post_while_probing(
        disaggregated,
        lambda: http.post("/completions", content=_chunks(body) if chunked else body,
                          headers=AUTH))
    grown = gateway.memory_info().rss - idle
    print(f"50 MB body ({'chunked' if chunked else 'content-length'}): refused in {seconds:.3f} s,"
          f" /health median {statistics.median(latencies) * 1000:.1f} ms, max"
          f" {max(latencies) * 1000:.1f} ms over {len(latencies)} probes, gateway RSS"
          f" {idle / 2**20:.0f} MB -> +{grown / 2**20:.1f} MB")
    assert response.status_code == 413
    assert seconds < 1.0
    assert max(latencies) < 0.5
    assert grown < 100 * 2**20


def test_a_long_prompt_is_tokenized_off_the_event_loop(http, disaggregated):
    """1 MB of text, allowed by the cap, takes seconds to tokenize (and is then too long for the
    context): /health keeps answering meanwhile."""
    text = "The quick brown fox jumps over the lazy dog; 0123456789. " * (2**20 // 57)
    response, seconds, latencies = _post_while_probing(
        disaggregated, lambda: http.post("/completions", headers=AUTH,
                                         json={"prompt": text, "max_tokens": 1}))
    print(f"1 MB prompt: answered in {seconds:.2f} s, /health max {max(latencies) * 1000:.1f} ms"
          f" over {len(latencies)} probes")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert max(latencies) < min(0.5, seconds / 3), (seconds, max(latencies))
