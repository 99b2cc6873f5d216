"""The engine on its own thread, driven from an asyncio event loop.

The engine is single-threaded by design (as vLLM's core loop), so every mutation runs on its thread:
callers submit commands that run between steps, and each request's outputs arrive on its own asyncio
queue.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from baton.services.common.outputs import RequestOutput
from baton.services.engine.llm_engine import LLMEngine

log = logging.getLogger(__name__)
T = TypeVar("T")
IDLE_WAIT_SECONDS = 0.05


class EngineLoop:
    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop
        # engine-thread hooks (events, notifications)
        self.after_step: list[Callable[[LLMEngine], None]] = []
        self._commands: queue.SimpleQueue[
            tuple[Callable[[LLMEngine], Any], asyncio.Future | None]] = queue.SimpleQueue()
        self._streams: dict[str, asyncio.Queue[RequestOutput]] = {}
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10)

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Runs fn(engine) on the engine thread between steps and returns (or raises) its result."""
        future = self.loop.create_future()
        self._commands.put((fn, future))
        self._wake.set()
        return await future

    def submit(self, fn: Callable[[LLMEngine], Any]) -> None:
        """Fire and forget: for cleanups that must happen even when the caller is being
        cancelled."""
        self._commands.put((fn, None))
        self._wake.set()

    def open_stream(self, request_id: str) -> asyncio.Queue[RequestOutput]:
        stream: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._streams[request_id] = stream
        return stream

    def close_stream(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    def _run(self) -> None:
        while not self._stopped:
            self._run_commands()
            if self.engine.has_unfinished_requests():
                self._dispatch(self.engine.step())
            else:
                self._wake.wait(IDLE_WAIT_SECONDS)
                self._wake.clear()
            for hook in self.after_step:
                hook(self.engine)

    def _run_commands(self) -> None:
        while True:
            try:
                fn, future = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                result = fn(self.engine)
            except Exception as e:  # handed to the awaiting caller, which maps it to a status
                if future is None:
                    log.exception("engine command failed")
                else:
                    self.loop.call_soon_threadsafe(_settle, future, None, e)
                continue
            if future is not None:
                self.loop.call_soon_threadsafe(_settle, future, result, None)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        # One wake-up of the event loop per step rather than per output: each call_soon_threadsafe
        # writes to the loop's self-pipe, a system call on the thread that feeds the device.
        if outputs:
            self.loop.call_soon_threadsafe(self._deliver, outputs)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                stream.put_nowait(out)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
