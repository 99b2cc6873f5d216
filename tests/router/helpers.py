"""Shared builders for the router tests: a settable clock and worker stats as the workers send
them (and as the router reads them)."""
from __future__ import annotations

from baton.services.common.messages.worker import LoadReport
from baton.services.common.roles import Role
from baton.services.common.wire.router import load_report_from_proto
from baton.services.router.worker_state import CircuitBreaker, SaturationLimits, WorkerState
from baton.v1 import worker_pb2

LIMITS = SaturationLimits(max_stats_age_s=2.0, queued_prefill_tokens=10_000, inflight_requests=100,
                          kv_utilization=0.95)


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def stats(worker_id: str, at: float, *, queued: int = 0, running: int = 0, waiting: int = 0,
          kv_used: int = 0, kv_total: int = 1000, draining: bool = False,
          role: int = worker_pb2.ROLE_DECODE) -> worker_pb2.WorkerStats:
    return worker_pb2.WorkerStats(worker_id=worker_id, role=role, timestamp_unix_ms=int(at * 1000),
                                  num_running=running, num_waiting=waiting, kv_blocks_used=kv_used,
                                  kv_blocks_total=kv_total, prefill_tokens_queued=queued,
                                  draining=draining, block_size=16, model="m")


def report(worker_id: str, at: float, **load: int) -> LoadReport:
    """stats(...) as the router's worker feed hands it on."""
    return load_report_from_proto(stats(worker_id, at, **load))


def worker(worker_id: str, role: Role = Role.DECODE, at: float | None = None,
           **load: int) -> WorkerState:
    """A registered worker; with `at`, it has reported stats taken at that time."""
    w = WorkerState(worker_id, f"{worker_id}:50051", role, CircuitBreaker(3, 10.0))
    if at is not None:
        w.on_stats(report(worker_id, at, **load))
    return w
