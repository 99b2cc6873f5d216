"""Drives one load-test run: open-loop (requests sent at scheduled times, answered or not) or
closed-loop (a fixed number of users, each sending its next request when the last one ends).

Every run is bounded: nothing new is sent after `duration_s`, requests still running get
`drain_timeout_s` more, and whatever is left then is cancelled and counted as failed. A load test
that never ends would hide exactly the requests a stuck server loses.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from baton.loadtest.client import Target, send_completion
from baton.loadtest.progress import Progress
from baton.loadtest.scenarios import LoadRequest
from baton.loadtest.stats import FAILED, OK, RequestResult

@dataclass
class RunResult:
    results: list[RequestResult]
    duration_s: float  # first send to last answer (or the drain deadline)
    scheduled: int
    # the answered requests' prompts, in send order
    answered_prompts: list[list[int]] = field(default_factory=list)


class _Run:

    def __init__(self, target: Target, duration_s: float, drain_timeout_s: float,
                 progress: Progress) -> None:
        self.target = target
        self.duration_s = duration_s
        self.drain_timeout_s = drain_timeout_s
        self.progress = progress
        self.origin = time.perf_counter()
        self.results: list[RequestResult] = []
        self.answered: list[tuple[float, list[int]]] = []
        # Multi-turn: each session's latest turn, which its next turn waits for.
        self.sessions: dict[int, asyncio.Task] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.origin

    async def one(self, client: httpx.AsyncClient, request: LoadRequest,
                  after: asyncio.Task | None) -> None:
        try:
            if after is not None:
                await asyncio.wait([after])
            result = await send_completion(client, self.target, self.target.prompt_of(request),
                                           request.output_len, self.origin, len(request.prompt))
        except asyncio.CancelledError:
            result = RequestResult(
                self.elapsed(), FAILED, prompt_tokens=len(request.prompt),
                error=f"not finished {self.drain_timeout_s:g}s after the end of the run")
        self.results.append(result)
        if result.status == OK:
            self.answered.append((result.start_s, request.prompt))
        self.progress.done(result)

    def answered_in_order(self) -> list[list[int]]:
        return [prompt for _, prompt in sorted(self.answered, key=lambda pair: pair[0])]

    def spawn(self, client: httpx.AsyncClient, request: LoadRequest) -> asyncio.Task:
        after = self.sessions.get(request.session) if request.session is not None else None
        task = asyncio.create_task(self.one(client, request, after))
        if request.session is not None:
            self.sessions[request.session] = task
        return task

    async def drain(self, tasks: set[asyncio.Task]) -> None:
        pending = {t for t in tasks if not t.done()}
        if pending:
            _, pending = await asyncio.wait(pending, timeout=self.drain_timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


async def _open_loop(run: _Run, client: httpx.AsyncClient,
                     schedule: list[tuple[float, LoadRequest]]) -> None:
    tasks: set[asyncio.Task] = set()
    for at, request in schedule:
        delay = at - run.elapsed()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.add(run.spawn(client, request))
    await run.drain(tasks)


async def _closed_loop(run: _Run, client: httpx.AsyncClient, requests: Iterator[LoadRequest],
                       concurrency: int) -> None:
    # one shared stream of requests, so every user draws the next one in order
    lock = asyncio.Lock()

    async def user() -> None:
        while run.elapsed() < run.duration_s:
            async with lock:
                request = next(requests, None)
            if request is None:
                return
            await run.one(client, request, None)

    await run.drain({asyncio.create_task(user()) for _ in range(concurrency)})


def _client(connections: int) -> httpx.AsyncClient:
    # No read timeout of its own: the drain deadline bounds every request, and a long prefill under
    # overload is a latency to measure, not an error.
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), limits=limits)


async def run_open_loop(target: Target, schedule: list[tuple[float,
                                                             LoadRequest]], duration_s: float,
                        drain_timeout_s: float = 60.0, show_progress: bool = True) -> RunResult:
    """Sends each request at its time (seconds from the start; times past duration_s are not
    sent)."""
    schedule = [(at, r) for at, r in schedule if at < duration_s]
    progress = Progress(len(schedule), "loadtest", show_progress)
    run = _Run(target, duration_s, drain_timeout_s, progress)
    try:
        async with _client(max(64, len(schedule))) as client:
            await _open_loop(run, client, schedule)
    finally:
        progress.close()
    return RunResult(run.results, _span(run), len(schedule), run.answered_in_order())


async def run_closed_loop(target: Target, requests: Iterator[LoadRequest], concurrency: int,
                          duration_s: float, drain_timeout_s: float = 60.0,
                          show_progress: bool = True) -> RunResult:
    progress = Progress(None, f"loadtest c={concurrency}", show_progress)
    run = _Run(target, duration_s, drain_timeout_s, progress)
    try:
        async with _client(concurrency) as client:
            await _closed_loop(run, client, requests, concurrency)
    finally:
        progress.close()
    return RunResult(run.results, _span(run), len(run.results), run.answered_in_order())


def _span(run: _Run) -> float:
    """The run's wall time: from the start to when the last request ended (at least the planned
    duration, so a server that answers nothing does not get a tiny denominator)."""
    return max(run.duration_s, run.elapsed())


def schedule(times: list[float],
             requests: Iterator[LoadRequest]) -> list[tuple[float, LoadRequest]]:
    """Pairs send times with the workload's requests in order (a trace shorter than the schedule
    ends it)."""
    return list(zip(times, itertools.islice(requests, len(times))))
