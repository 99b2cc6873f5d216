"""One usage record per request served, on every endpoint, in the state store: inserted
'in_progress' when the request starts, brought up to date (tokens served so far) every
--usage-update-interval-s while it runs, and settled once when it ends: completed, failed,
cancelled (its client left) or rejected (refused before its first token). A gateway killed
mid-request leaves its record with what it had served; the next sweep of any gateway on the store
settles it 'failed' once it has not moved for --usage-stale-after-s.

Writes never hold up a request: they run beside it, and one that fails (the store down) is logged
and counted, and retried with the final figures when the request settles."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from baton.services.openai.render import Choice
from baton.services.state.responses_repo import expire_responses
from baton.services.state.store import StateStore, StoreUnavailable
from baton.services.state.usage_repo import (IN_PROGRESS, insert_usage, settle_stale,
                                             update_usage)

log = logging.getLogger(__name__)


@dataclass
class UsageTicket:
    """A request's record while it runs; `states` are its choices, filled as tokens arrive."""
    id: str
    tenant: str
    key_id: str | None
    endpoint: str
    model: str
    prompt_tokens: int
    started_at: float = field(default_factory=time.time)
    states: Sequence[Choice] = ()
    ttft_s: float | None = None
    settled: bool = False
    opened: asyncio.Task | None = None

    def saw_ttft(self, ttft_s: float) -> None:
        self.ttft_s = ttft_s if self.ttft_s is None else min(self.ttft_s, ttft_s)

    def figures(self) -> dict[str, Any]:
        """The columns that change while it runs."""
        states = self.states
        return {"completion_tokens": sum(len(s.token_ids) for s in states),
                "cached_tokens": max((s.num_cached_tokens for s in states), default=0),
                "ttft_s": self.ttft_s, "updated_at": time.time()}

    def row(self, status: str) -> dict[str, Any]:
        return {"id": self.id, "tenant": self.tenant, "key_id": self.key_id,
                "endpoint": self.endpoint, "model": self.model, "adapter": None,
                "prompt_tokens": self.prompt_tokens, "status": status,
                "started_at": self.started_at, **self.figures()}


class UsageMeter:
    def __init__(self, store: StateStore, write_failures: Counter,
                 stale_after_s: float, response_ttl_s: float | None) -> None:
        self.store = store
        self.write_failures = write_failures
        self.stale_after_s, self.response_ttl_s = stale_after_s, response_ttl_s
        self.live: dict[str, UsageTicket] = {}
        self._writes: set[asyncio.Task] = set()  # kept referenced until done

    def open(self, request_id: str, tenant: str, key_id: str | None, endpoint: str, model: str,
             prompt_tokens: int, states: Sequence[Choice]) -> UsageTicket:
        ticket = UsageTicket(request_id, tenant, key_id, endpoint,
                             model, prompt_tokens, states=states)
        self.live[ticket.id] = ticket
        ticket.opened = self._spawn(insert_usage(self.store, ticket.row(IN_PROGRESS)), "insert")
        return ticket

    def settle(self, ticket: UsageTicket, status: str) -> None:
        """Writes the final figures once; a second call does nothing."""
        if ticket.settled:
            return
        ticket.settled = True
        self.live.pop(ticket.id, None)
        self._spawn(self._settle(ticket, status), "settle")

    async def _settle(self, ticket: UsageTicket, status: str) -> None:
        if ticket.opened is not None:
            await asyncio.wait({ticket.opened})
        values = {**ticket.figures(), "status": status, "ended_at": time.time()}
        # the insert failed (the store was down then): the settled record is the only one
        if not await update_usage(self.store, ticket.id, values):
            await insert_usage(self.store, {**ticket.row(status), **values})

    def _spawn(self, work: Any, what: str) -> asyncio.Task:
        task = asyncio.ensure_future(self._guarded(work, what))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def _guarded(self, work: Any, what: str) -> None:
        try:
            await work
        except StoreUnavailable as e:
            self.write_failures.labels(what).inc()
            log.warning("usage record %s failed: %s", what, e)

    async def watch(self, interval_s: float, sleep: Callable = asyncio.sleep) -> None:
        """Every interval: the live records brought up to date, stale ones settled, expired
        responses removed."""
        while True:
            await sleep(interval_s)
            await self._guarded(self._housekeeping(), "update")

    async def _housekeeping(self) -> None:
        for ticket in list(self.live.values()):
            if ticket.opened is not None and ticket.opened.done():
                await update_usage(self.store, ticket.id, ticket.figures(), only_in_progress=True)
        stale = await settle_stale(self.store, self.stale_after_s)
        if stale:
            log.warning("%d usage records of requests whose gateway died settled as failed", stale)
        if self.response_ttl_s is not None:
            expired = await expire_responses(self.store)
            if expired:
                log.info("%d expired responses deleted", expired)

    async def drain(self) -> None:
        """Waits for the writes under way (at shutdown)."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=10)
