"""Why the router refused a request: every reason is one of these values, and each is counted."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class RejectReason(str, enum.Enum):
    TTFT_SLO = "ttft_slo"  # predicted time to first token misses the request's SLO
    # every decode worker's predicted time per output token misses the request's SLO
    TPOT_SLO = "tpot_slo"
    QUEUE_FULL = "queue_full"  # the admission queue holds nothing it could displace
    PREEMPTED = "preempted"  # displaced from a full queue by a higher-priority request
    QUEUE_TIMEOUT = "queue_timeout"  # waited longer than the queue's age bound
    DEADLINE = "deadline"  # can no longer get its first token before its deadline
    SHED = "shed"  # sheddable (negative priority) and every worker is saturated
    # no worker can take it at all (none registered, all draining or broken)
    NO_WORKERS = "no_workers"
    UNKNOWN_MODEL = "unknown_model"  # names a model this router does not route

    @property
    def grpc_status(self) -> str:
        """The grpc.StatusCode name a servicer answers with; the gateway maps RESOURCE_EXHAUSTED to
        HTTP 429."""
        if self is RejectReason.UNKNOWN_MODEL:
            return "NOT_FOUND"
        return "UNAVAILABLE" if self is RejectReason.NO_WORKERS else "RESOURCE_EXHAUSTED"


@dataclass(frozen=True)
class Rejection:
    request_id: str
    reason: RejectReason
    message: str
    retry_after_s: float | None = None
