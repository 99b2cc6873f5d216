"""The engine on its own thread, driven from an asyncio event loop.

The engine is single-threaded by design (as vLLM's core loop), so every mutation runs on its thread.
The worker sends it named, typed commands, the engine's serving API (llm_engine.SERVING_API): each
is queued, runs between two steps in the order sent, and its result (or exception) comes back to
the awaiting caller. Each request's outputs arrive on its own asyncio queue.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import torch

from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.engine.kv.block_manager import Medium
from baton.services.engine.kv.handoff import HeldKV, Reservation
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.lora import runtime as lora_runtime
from baton.services.engine.lora.modules import LoRAModule
from baton.services.engine.requests import EngineRequest
from baton.services.worker.kv_events import KVEventLog

log = logging.getLogger(__name__)
P = ParamSpec("P")
T = TypeVar("T")
IDLE_WAIT_SECONDS = 0.05
# A command: what runs on the engine thread, its arguments after the engine, and the future its
# caller awaits (None when nobody does).
_Command = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], "asyncio.Future[Any] | None"]


class EngineLoop:
    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop
        # engine-thread hooks (events, notifications); adapters unloaded at runtime go once their
        # last request has ended
        self.after_step: list[Callable[[LLMEngine], None]] = [lora_runtime.drop_retired]
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
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

    # Requests in and out.

    async def submit(self, request: EngineRequest, *, output_token_ids: list[int] | None = None,
                     hold_kv: bool = False) -> None:
        """Queues a request (LLMEngine.submit). Raises ValueError when it can never be served."""
        await self._call(LLMEngine.submit, request, output_token_ids=output_token_ids,
                         hold_kv=hold_kv)

    async def abort(self, request_id: str) -> bool:
        """Stops a request wherever it is; whether it was anywhere here."""
        return await self._call(LLMEngine.abort, request_id)

    def abort_nowait(self, request_id: str) -> None:
        """abort without waiting: a cleanup that must happen even when its caller is being
        cancelled."""
        self._send(LLMEngine.abort, request_id)

    def open_stream(self, request_id: str) -> asyncio.Queue[RequestOutput]:
        stream: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._streams[request_id] = stream
        return stream

    def close_stream(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    # The hand-off, decode side.

    async def reserve_prefilled(self, request: EngineRequest) -> Reservation | None:
        """Blocks for a prompt whose KV comes from elsewhere, saying which are cached here already
        or loading from this worker's KV tiers; None when there is no room now."""
        return await self._call(LLMEngine.reserve_prefilled, request)

    async def prefilled_loaded(self, request_id: str) -> int | None:
        """A reservation's leading blocks in place once its tier load has ended; None before."""
        return await self._call(LLMEngine.prefilled_loaded, request_id)

    async def commit_prefilled(self, request_id: str, first_token: int,
                               first_logprobs: TokenLogprobs | None = None,
                               head_row: torch.Tensor | None = None) -> RequestOutput:
        """The reserved blocks hold the prompt's KV (and head_row: its EAGLE head's): the
        request joins the batch."""
        return await self._call(LLMEngine.commit_prefilled, request_id, first_token,
                                first_logprobs, head_row)

    async def park_reserved(self, request_id: str) -> int:
        """Keeps a failed pull's blocks out of use; the ticket that releases them."""
        return await self._call(LLMEngine.park_reserved, request_id)

    def park_reserved_nowait(self, request_id: str) -> asyncio.Future[int]:
        """park_reserved, queued at once (ahead of any later command) by a caller being cancelled;
        the future gets the ticket."""
        return self._enqueue(LLMEngine.park_reserved, request_id)

    def release_parked_nowait(self, ticket: int) -> None:
        self._send(LLMEngine.release_parked, ticket)

    # The hand-off, prefill side (release_kv ends a decode side's reservation too).

    async def held_kv(self, request_id: str) -> HeldKV | None:
        return await self._call(LLMEngine.held_kv, request_id)

    async def release_kv(self, request_id: str) -> bool:
        return await self._call(LLMEngine.release_kv, request_id)

    # The prefix cache, mirrored by the router.

    async def kv_snapshot(self, events: KVEventLog) -> tuple[int, dict[Medium, list[int]]]:
        """Every block hash the prefix cache can hit now (and each KV tier holds), and the event
        sequence number that covers them all (the engine's pending block events are drained into
        `events` first)."""
        return await self._call(_kv_snapshot, events)

    # LoRA adapters loaded and unloaded at runtime.

    async def load_lora(self, module: LoRAModule) -> None:
        """Reads and checks the adapter on a thread of its own, then serves it. Raises LoRAError."""
        weights = await asyncio.to_thread(lora_runtime.read, self.engine, module)
        await self._call(lora_runtime.load, module, weights)

    async def unload_lora(self, name: str) -> int:
        """Refuses new requests for the adapter; the requests still to end under it before it is
        dropped. Raises LoRANotFound (or LoRAOff)."""
        return await self._call(lora_runtime.unload, name)

    async def _call(self, command: Callable[Concatenate[LLMEngine, P], T], *args: P.args,
                    **kwargs: P.kwargs) -> T:
        """Runs command(engine, ...) on the engine thread between steps and returns (or raises) its
        result."""
        return await self._enqueue(command, *args, **kwargs)

    def _enqueue(self, command: Callable[Concatenate[LLMEngine, P], T], *args: P.args,
                 **kwargs: P.kwargs) -> asyncio.Future[T]:
        future = self.loop.create_future()
        self._commands.put((command, args, kwargs, future))
        self._wake.set()
        return future

    def _send(self, command: Callable[..., Any], *args: Any) -> None:
        self._commands.put((command, args, {}, None))
        self._wake.set()

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
                command, args, kwargs, future = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                result = command(self.engine, *args, **kwargs)
            except Exception as e:  # handed to the awaiting caller, which maps it to a status
                if future is None:
                    log.exception("engine command %s%r failed", command.__name__, args)
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


def _kv_snapshot(engine: LLMEngine, events: KVEventLog) -> tuple[int, dict[Medium, list[int]]]:
    events.drain(engine)  # so that the sequence number covers every hash in the snapshot
    return events.last_sequence, engine.cached_block_hashes()


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
