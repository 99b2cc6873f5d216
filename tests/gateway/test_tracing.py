"""OpenTelemetry: each service exports as the standard OTEL_* variables say, the gateway's root span
honours an incoming W3C traceparent, and its context reaches the router and both workers (separate
processes)."""
from __future__ import annotations

import json
import time

import httpx
import pytest
from opentelemetry import trace

from baton.services.common import tracing
from baton.services.common.process import ServiceProcess
from tests.launcher import launch_gateway, launch_router, launch_sim_worker

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"


@pytest.mark.parametrize("env, expected", [
    ({}, []),
    ({"OTEL_TRACES_EXPORTER": "none"}, []),
    ({"OTEL_TRACES_EXPORTER": "console, otlp"}, ["console", "otlp"]),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, ["otlp"]),
])
def test_exporters_come_from_the_standard_variables(monkeypatch, env, expected):
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
                 "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tracing.exporter_names() == expected


def test_nothing_is_installed_without_otel_variables(monkeypatch):
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    before = trace.get_tracer_provider()
    assert not tracing.setup_tracing("baton-test")
    assert trace.get_tracer_provider() is before


def _spans(service: ServiceProcess) -> list[dict]:
    """The spans ConsoleSpanExporter printed: one indented JSON object each, opening at the start of
    a line."""
    text, decoder, spans = service.log(), json.JSONDecoder(), []
    start = text.find("{\n")
    while start >= 0:
        try:
            span, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            end = start + 1
        else:
            if isinstance(span, dict) and "context" in span:
                spans.append(span)
        start = text.find("{\n", end)
    return spans


@pytest.fixture(scope="module")
def traced_stack():
    env = {"OTEL_TRACES_EXPORTER": "console"}
    started: list[ServiceProcess] = []
    try:
        for role in ("prefill", "decode"):
            started.append(launch_sim_worker(f"{role}-worker", "--sim-step-base-seconds", "0",
                                             role=role, env=env)[0])
        workers = [w.wait_ready() for w in started]
        started.append(launch_router("router", "--workers", ",".join(w.address for w in workers),
                                     "--max-local-prefill-tokens", "0", env=env)[0])  # hand off
        started[-1].wait_ready()
        started.append(launch_gateway("gateway", started[-1].address, env=env)[0])
        started[-1].wait_ready()
        yield dict(zip(("prefill", "decode", "router", "gateway"), started))
    finally:
        for service in reversed(started):
            service.terminate()


def _wait_for(service: ServiceProcess, name: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [
            s for s in _spans(service)
            if s["name"] == name and s["context"]["trace_id"] == "0x" + TRACE_ID
        ]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"{service.name} exported no {name!r} span of the trace:\n{service.log()}")


def test_request_span_honours_traceparent_and_reaches_router_and_workers(traced_stack):
    response = httpx.post(f"http://{traced_stack['gateway'].address}/v1/completions", timeout=60,
                          json={"prompt": [11] * 40, "max_tokens": 3},
                          headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01"})
    assert response.status_code == 200, response.text
    root = _wait_for(traced_stack["gateway"], "request")
    assert root["parent_id"] == "0x" + CLIENT_SPAN_ID
    assert root["resource"]["attributes"]["service.name"] == "baton-gateway"
    place = _wait_for(traced_stack["router"], "router.place")
    prefill = _wait_for(traced_stack["prefill"], "prefill")
    decode = _wait_for(traced_stack["decode"], "decode")
    for child in (place, prefill, decode):
        assert child["parent_id"] == root["context"]["span_id"], child
    transfer = _wait_for(traced_stack["decode"], "kv_transfer")
    assert transfer["parent_id"] == decode["context"]["span_id"]
