"""Metrics and the one log line of every KV read, shared by both transports."""
from __future__ import annotations

import logging
import threading
import time
from abc import abstractmethod
from typing import Callable
from weakref import WeakKeyDictionary

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from baton.services.worker.kv_transfer.base import (KVPeer, KVTransferError, KVTransport,
                                                    TransferResult)

log = logging.getLogger(__name__)

# From one 64 KiB block on shared memory (tens of microseconds) to a long prompt over TCP (seconds).
DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                    0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class TransferMetrics:
    """The KV-transfer series of one registry; `for_registry` hands out one instance per registry,
    since prometheus_client refuses a second registration of the same names."""

    _by_registry: "WeakKeyDictionary[CollectorRegistry, TransferMetrics]" = WeakKeyDictionary()
    _lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry) -> None:
        self.bytes = Counter("baton_kv_transfer_bytes", "KV bytes read from peers", ["transport"],
                             registry=registry)
        self.duration = Histogram("baton_kv_transfer_duration_seconds",
                                  "Duration of successful KV reads", ["transport"],
                                  buckets=DURATION_BUCKETS, registry=registry)
        self.failures = Counter("baton_kv_transfer_failures", "KV reads that raised",
                                ["transport", "reason"], registry=registry)

    @classmethod
    def for_registry(cls, registry: CollectorRegistry | None = None) -> "TransferMetrics":
        registry = REGISTRY if registry is None else registry
        with cls._lock:
            if registry not in cls._by_registry:
                cls._by_registry[registry] = cls(registry)
            return cls._by_registry[registry]


def observe_read(metrics: TransferMetrics | None, transport: str, request_id: str,
                 read: Callable[[], TransferResult]) -> TransferResult:
    """Runs one read, counts it, and logs its failure (the single place a failed read is logged)."""
    start = time.perf_counter()
    try:
        result = read()
    except KVTransferError as e:
        log.warning("KV read over %s for request %s failed (%s) after %.3f s: %s", transport,
                    request_id, e.reason,
                    time.perf_counter() - start, e)
        if metrics is not None:
            metrics.failures.labels(transport, e.reason).inc()
        raise
    if metrics is not None:
        metrics.bytes.labels(transport).inc(result.num_bytes)
        metrics.duration.labels(transport).observe(result.seconds)
    return result


class ObservedTransport(KVTransport):
    """A transport whose `read` is its own `_read` inside the shared metrics and log line, keyed by
    the request id the notification carries."""
    name: str
    _metrics: TransferMetrics | None

    def read(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
             notification: bytes, timeout_s: float) -> TransferResult:
        request_id = notification.decode("utf-8", "replace")
        return observe_read(
            self._metrics, self.name, request_id,
            lambda: self._read(peer, remote_blocks, local_blocks, notification, timeout_s))

    @abstractmethod
    def _read(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
              notification: bytes, timeout_s: float) -> TransferResult:
        """The copy itself, with the same contract as `read`."""
