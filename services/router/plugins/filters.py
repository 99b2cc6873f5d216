"""Filters: who may receive new work at all."""
from __future__ import annotations

from collections.abc import Iterable

from baton.services.common.roles import Role
from baton.services.router.plugins.base import Filter, SchedulingRequest
from baton.services.router.plugins.registry import filter_class, register_filter
from baton.services.router.worker_state import WorkerState


@register_filter
class HealthFilter(Filter):
    """Drops workers whose registration lease ran out (they stopped heartbeating)."""
    name = "health"

    def keep(self, request: SchedulingRequest, worker: WorkerState) -> bool:
        return worker.is_alive(request.now)


@register_filter
class CircuitFilter(Filter):
    """Drops workers whose circuit breaker is open, or half-open with its one probe already out."""
    name = "circuit"

    def keep(self, request: SchedulingRequest, worker: WorkerState) -> bool:
        return worker.breaker.allows(request.now)


@register_filter
class DrainingFilter(Filter):
    """Drops workers being scaled down, whether the router was told (Drain) or the worker says
    so."""
    name = "draining"

    def keep(self, request: SchedulingRequest, worker: WorkerState) -> bool:
        return not worker.is_draining()


class RoleFilter(Filter):
    name = "role"

    def __init__(self, roles: Iterable[Role]) -> None:
        self.roles = frozenset(roles)

    def keep(self, request: SchedulingRequest, worker: WorkerState) -> bool:
        return worker.role in self.roles


# Applied after the role filter, in this order; each a registered name.
DEFAULT_FILTERS = ("health", "circuit", "draining")


def default_filters(roles: Iterable[Role]) -> list[Filter]:
    # The role filter first: it is the cheapest and drops the most (the other pool), so the rest see
    # fewer.
    return [RoleFilter(roles), *(filter_class(name)() for name in DEFAULT_FILTERS)]
