"""Leases on a prefill worker's held KV blocks: granted at prefill, extended by the decode side's
heartbeats, ended by its release notice or by expiry (so a dead decode worker never pins blocks for
long).

A lease that the decode side has confirmed (extended before its read) is that side's to end: it may
be reading the blocks, and a one-sided read cannot tell them from reused ones, so a caller that
abandons the request (Abort) leaves such a lease alone.

A lease is the hand-off's clock only: the engine owns the blocks (HELD in
services/engine/kv/handoff.py, where the whole lifecycle is drawn), and ending a lease is what tells
the worker to release them there."""
from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Lease:
    request_id: str
    expires_at: float  # time.time() seconds
    confirmed: bool = False  # a decode worker extended it: a read may be under way


class LeaseTable:
    def __init__(self, lease_seconds: float) -> None:
        self.lease_seconds = lease_seconds
        self._leases: dict[str, Lease] = {}

    def __len__(self) -> int:
        return len(self._leases)

    def grant(self, request_id: str) -> Lease:
        lease = Lease(request_id, time.time() + self.lease_seconds)
        self._leases[request_id] = lease
        return lease

    def get(self, request_id: str) -> Lease | None:
        lease = self._leases.get(request_id)
        return lease if lease is not None and lease.expires_at > time.time() else None

    def extend(self, request_id: str) -> Lease | None:
        lease = self.get(request_id)
        if lease is not None:
            lease.expires_at = time.time() + self.lease_seconds
            lease.confirmed = True
        return lease

    def confirmed(self, request_id: str) -> bool:
        lease = self.get(request_id)
        return lease is not None and lease.confirmed

    def end(self, request_id: str) -> bool:
        return self._leases.pop(request_id, None) is not None

    def take_expired(self) -> list[str]:
        now = time.time()
        expired = [rid for rid, lease in self._leases.items() if lease.expires_at <= now]
        for rid in expired:
            del self._leases[rid]
        return expired

    def request_ids(self) -> list[str]:
        return list(self._leases)
