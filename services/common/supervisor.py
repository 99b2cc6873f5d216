"""Keeps a set of child services alive (`baton serve`'s workers, router and gateway).

A child that exits is started again as it was started, on the same ports, since the router and the
gateway know the others by address; meanwhile the rest keep serving (the router's circuit breaker
keeps placements off a dead worker, and the gateway moves its broken streams). Restarts back off
exponentially while a child keeps dying, and each one is logged once: the child, how it ended, the
attempt, the delay, and its last output lines. A child that dies more than `max_restarts` times
within `window_s` is beyond what restarting fixes: the supervisor gives up (GaveUp), and the caller
stops the stack."""
from __future__ import annotations

import logging
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from baton.services.common.process import ServiceProcess

log = logging.getLogger(__name__)
LAST_LINES = 20


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int  # deaths of one child within window_s that are still restarted
    window_s: float
    backoff_s: float  # delay before the first restart of a run of deaths; doubles with each
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts must be 0 or more, not {self.max_restarts}")
        if not self.window_s > 0 or not self.backoff_s > 0:
            raise ValueError(f"--restart-window-s and --restart-backoff-s must be positive, not "
                             f"{self.window_s} and {self.backoff_s}")

    def delay_s(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2**(attempt - 1))


class GaveUp(RuntimeError):
    """A child keeps dying: restarting it does not help."""


def how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class _Child:
    service: ServiceProcess
    started_at: float
    deaths: deque[float] = field(default_factory=deque)
    attempt: int = 0  # restarts since it last stayed up for a whole window
    restart_at: float | None = None  # set while it waits out its back-off
    announced: bool = True  # whether its return (ready line) after a restart was logged


class Supervisor:
    def __init__(self, services: Sequence[ServiceProcess], policy: RestartPolicy,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        now = clock()
        self._children = [_Child(service, now) for service in services]

    def check(self) -> None:
        """One pass: notes the children that died, restarts those whose back-off is over, and logs
        those back. Call it every fraction of a second; raises GaveUp."""
        now = self._clock()
        for child in self._children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._restart(child, now)
                continue
            code = child.service.process.poll()
            if code is None:
                self._watch_running(child, now)
            else:
                self._on_death(child, code, now)

    def _watch_running(self, child: _Child, now: float) -> None:
        if not child.announced and child.service.ready.is_set():
            child.announced = True
            log.info("%s is back at %s (restart %d)", child.service.name, child.service.address,
                     child.attempt)
        if child.attempt and now - child.started_at >= self.policy.window_s:
            child.attempt = 0  # stayed up: the next death starts the back-off afresh

    def _on_death(self, child: _Child, code: int, now: float) -> None:
        service, policy = child.service, self.policy
        while child.deaths and now - child.deaths[0] > policy.window_s:
            child.deaths.popleft()
        child.deaths.append(now)
        last = "\n".join(list(service.output)[-LAST_LINES:])
        if len(child.deaths) > policy.max_restarts:
            log.error("%s %s; its last lines:\n%s", service.name, how_it_ended(code), last)
            raise GaveUp(f"{service.name} died {len(child.deaths)} times within "
                         f"{policy.window_s:.0f}s (last: {how_it_ended(code)})")
        child.attempt += 1
        delay = policy.delay_s(child.attempt)
        child.restart_at = now + delay
        log.error("%s %s; restart %d in %.1fs; its last lines:\n%s", service.name,
                  how_it_ended(code), child.attempt, delay, last)

    def _restart(self, child: _Child, now: float) -> None:
        child.restart_at, child.started_at, child.announced = None, now, False
        child.service.relaunch()
