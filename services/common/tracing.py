"""OpenTelemetry export for a Baton process, configured only by the standard OTEL_* environment
variables.

Spans are created everywhere through the API (a no-op until a provider is set); a process exports
them only when OTEL_TRACES_EXPORTER or an OTLP endpoint is set, so nothing is paid for tracing that
nobody collects. Exporter names resolve through the SDK's `opentelemetry_traces_exporter` entry
points, as opentelemetry-instrument does: `console` ships with the SDK, `otlp` needs
opentelemetry-exporter-otlp installed. The service name, resource attributes and sampler come from
OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES and OTEL_TRACES_SAMPLER.
"""
from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter

log = logging.getLogger(__name__)


def exporter_names() -> list[str]:
    """The exporters OTEL_* asks for: OTEL_TRACES_EXPORTER's list, else otlp when only an endpoint
    is set."""
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not names:
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    return [n.strip() for n in names.split(",") if n.strip() and n.strip() != "none"]


def _exporter(name: str) -> SpanExporter | None:
    found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
    if not found:
        log.warning(
            "OTEL_TRACES_EXPORTER names %r, which is not installed; its spans are not exported",
            name)
        return None
    return found[0].load()()


def setup_tracing(service_name: str) -> bool:
    """Installs a tracer provider exporting as OTEL_* says; False (and nothing installed) when it
    says nothing."""
    exporters = [e for e in map(_exporter, exporter_names()) if e is not None]
    if not exporters:
        return False
    # Resource.create adds OTEL_RESOURCE_ATTRIBUTES; explicit attributes would override
    # OTEL_SERVICE_NAME there.
    resource = Resource.create({SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME") or service_name})
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        # The console exporter writes each span as it ends (a log line, not a network call); others
        # batch.
        processor = SimpleSpanProcessor if type(
            exporter).__name__ == "ConsoleSpanExporter" else BatchSpanProcessor
        provider.add_span_processor(processor(exporter))
    trace.set_tracer_provider(provider)
    return True
