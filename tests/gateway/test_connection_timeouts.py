"""The gateway closes connections that hold it up: one that sends nothing, a request head or body
that does not arrive in time (408, even when bytes trickle in), a kept-alive connection left idle.
A response that takes longer than every deadline (a long stream) is not cut. Raw sockets against a
real gateway, with deadlines of one second."""
from __future__ import annotations

import json
import select
import socket
import time

import openai
import pytest

from tests.launcher import gateway_on, scrape

DEADLINE_S = 1.0
SLACK_S = 8.0  # a loaded test machine fires timers late (seconds late on 2 busy cores), never early
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def port(sim_router):
    """A gateway with one-second deadlines over the session's sim worker (50 ms per step)."""
    with gateway_on(sim_router, "--slos=", f"--http-idle-timeout-s={DEADLINE_S}",
                    f"--http-header-timeout-s={DEADLINE_S}",
                    f"--http-body-timeout-s={DEADLINE_S}") as port:
        yield port


def exchange(port: int, chunks: list[bytes], gap_s: float = 0.0) -> tuple[bytes, float]:
    """Sends `chunks` (`gap_s` apart, while the connection stays open), then reads until the
    gateway closes it: (what came back, seconds from connecting to the close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S + SLACK_S) as sock:
        opened = time.monotonic()
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:  # answered (and closed): stop sending
                break
            sock.sendall(chunk)
            time.sleep(gap_s)
        received = b""
        while data := sock.recv(65536):  # socket.timeout fails the test: never closed
            received += data
        return received, time.monotonic() - opened


def assert_408(received: bytes, what: str) -> None:
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), received
    error = json.loads(body)["error"]
    assert error["code"] == "request_timeout" and what in error["message"], error


def test_a_connection_that_sends_nothing_is_closed(port):
    received, closed_after = exchange(port, [])
    assert received == b"" and DEADLINE_S * 0.9 <= closed_after < DEADLINE_S + SLACK_S


def test_half_a_head_is_answered_408(port):
    received, closed_after = exchange(port, [HEAD])
    assert_408(received, "head")
    assert DEADLINE_S * 0.9 <= closed_after < DEADLINE_S + SLACK_S


def test_a_trickled_head_does_not_push_the_deadline_back(port):
    # a byte every 150 ms, about 12 s in all: a deadline counted from the last byte would never pass
    trickle = [HEAD[i:i + 1] for i in range(len(HEAD))]
    assert len(trickle) * 0.15 > DEADLINE_S + SLACK_S
    received, closed_after = exchange(port, trickle, gap_s=0.15)
    assert_408(received, "head")
    assert closed_after < DEADLINE_S + SLACK_S


def test_a_body_that_stops_is_answered_408(port):
    before = scrape(f"http://127.0.0.1:{port}/metrics", "baton_gateway_client_timeouts_total",
                    phase="body")
    received, closed_after = exchange(port, [HEAD + b"Content-Length: 100\r\n\r\n{\"prompt\": "])
    assert_408(received, "body")
    assert DEADLINE_S * 0.9 <= closed_after < DEADLINE_S + SLACK_S
    assert scrape(f"http://127.0.0.1:{port}/metrics", "baton_gateway_client_timeouts_total",
                  phase="body") == before + 1


def test_a_kept_alive_connection_is_closed_when_idle(port):
    received, closed_after = exchange(port, [b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n"])
    assert received.startswith(b"HTTP/1.1 200 ") and received.endswith(b'{"status":"ok"}')
    assert DEADLINE_S * 0.9 <= closed_after < DEADLINE_S + SLACK_S


def test_a_stream_longer_than_every_deadline_is_not_cut(port):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                           max_retries=0)
    started = time.monotonic()
    stream = client.completions.create(model="tiny-llama", prompt="a long story", max_tokens=60,
                                       stream=True, extra_body={"ignore_eos": True})
    finished = [chunk.choices[0].finish_reason for chunk in stream if chunk.choices]
    took = time.monotonic() - started
    assert finished[-1] == "length" and took > 2 * DEADLINE_S
