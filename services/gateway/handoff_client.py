"""The caller's side of serving one request on workers: local (one worker computes everything) or
disaggregated (Prefill on one worker, then Generate with the KV handle on another). The gateway
orchestrates with this."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import grpc

from baton.services.common.sampling_params import SamplingParams
from baton.services.common.wire.worker import generate_request, handoff_request, prefill_request
from baton.v1 import worker_pb2 as pb
from baton.v1 import worker_pb2_grpc

log = logging.getLogger(__name__)
ABORT_TIMEOUT_S = 5.0
_aborts: set[asyncio.Future] = set()  # the loop keeps only weak references to its tasks


class PrefillFailed(grpc.aio.AioRpcError):
    """The Prefill call failed or ran past its deadline (the prefill worker's status and message):
    nothing was sent to the decode worker, so the caller may compute the prompt there instead."""

    @classmethod
    def of(cls, error: grpc.aio.AioRpcError) -> "PrefillFailed":
        return cls(error.code(), error.initial_metadata(), error.trailing_metadata(),
                   error.details(), error.debug_error_string())


def first_token_at_prefill(params: SamplingParams) -> bool:
    """Whether a hand-off's first token goes out as the prefill returns rather than after the
    hand-off. With stop strings its text may still be cut, which only the decode worker's
    detokenizer can tell."""
    return not params.stop


async def stream_tokens(
    decode: worker_pb2_grpc.WorkerStub, prefill: worker_pb2_grpc.WorkerStub | None,
    meta: pb.RequestMeta, prompt: Sequence[int], params: SamplingParams,
    metadata: Sequence[tuple[str, str]] = (), prefill_timeout_s: float | None = None
) -> AsyncIterator[pb.GenerateResponse]:
    """Yields the request's GenerateResponse messages, the first token included, whichever way it
    runs. gRPC errors propagate as grpc.aio.AioRpcError with the worker's status and message; those
    of the Prefill call (DEADLINE_EXCEEDED past prefill_timeout_s) as PrefillFailed."""
    if prefill is None:
        request = generate_request(meta, prompt, params)
    else:
        try:
            done = await prefill.Prefill(prefill_request(meta, prompt, params), metadata=metadata,
                                         timeout=prefill_timeout_s)
        except asyncio.CancelledError:
            abandon(prefill, meta.request_id)
            raise
        except grpc.aio.AioRpcError as e:
            abandon(prefill, meta.request_id)
            raise PrefillFailed.of(e) from None
        if done.finish_reason:
            yield _finished_at_prefill(done, len(prompt))
            return
        # The prompt was scored on the prefill worker; the decode worker need not score it again.
        request = handoff_request(meta, prompt, replace(params, prompt_logprobs=None), done,
                                  first_token_at_prefill(params))
    call = decode.Generate(request, metadata=metadata)  # under way before the first yield
    # Until the decode worker answers, the prefill worker's lease may be no one's to release.
    handed_off = prefill is None
    try:
        if request.first_token_streamed:
            yield _first_token(done, len(prompt))
        async for message in call:
            handed_off = True
            # they travel on the stream's first message
            if prefill is not None and done.prompt_logprobs:
                message.prompt_logprobs.extend(done.prompt_logprobs)
                del done.prompt_logprobs[:]
            yield message
    finally:
        # a caller that stops reading (a client gone) aborts the request on the worker
        call.cancel()
        if not handed_off:
            abandon(prefill, meta.request_id)


def abandon(prefill: worker_pb2_grpc.WorkerStub, request_id: str) -> None:
    """Tells a prefill worker, in the background and best effort, that the request is given up: a
    prefill still computing stops, and a lease that no decode worker has taken over (confirmed) is
    freed now. One that cannot be reached frees the blocks when the lease expires."""

    async def abort() -> None:
        try:
            await prefill.Abort(pb.AbortRequest(request_id=request_id), timeout=ABORT_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            log.info("request %s: abort on its prefill worker failed: %s", request_id,
                     e.code().name)

    task = asyncio.ensure_future(abort())
    _aborts.add(task)
    task.add_done_callback(_aborts.discard)


def _first_token(done: pb.PrefillResponse, num_prompt_tokens: int) -> pb.GenerateResponse:
    """The prefill's answer as the stream's first message (its prompt logprobs move onto it)."""
    message = pb.GenerateResponse(token_ids=[done.first_token_id], text=done.text,
                                  num_prompt_tokens=num_prompt_tokens,
                                  num_cached_tokens=done.num_cached_tokens, kv_source="local")
    if done.HasField("first_logprob"):
        message.logprobs.append(done.first_logprob)
    message.prompt_logprobs.extend(done.prompt_logprobs)
    del done.prompt_logprobs[:]
    return message


def _finished_at_prefill(done: pb.PrefillResponse, num_prompt_tokens: int) -> pb.GenerateResponse:
    message = _first_token(done, num_prompt_tokens)
    message.finished, message.finish_reason = True, done.finish_reason
    which = done.WhichOneof("stop_reason")
    if which is not None:
        setattr(message, which, getattr(done, which))
    return message
