"""The Responses API's serving: a request continues its previous response's conversation (read
from the state store, for its tenant only), runs as its chat completion through the same serving
as /v1/chat/completions, and is stored (`store`, the default) in_progress when it starts and
final when it ends, so GET shows it as it stands. `background` runs it beside the request and
answers at once; POST .../cancel stops it. Every store operation that fails is a 503 for the
requests that need the store; `store: false` requests do not touch it."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from baton.services.gateway.errors import CLIENT_CLOSED, error_response
from baton.services.gateway.orchestrator import Refused
from baton.services.gateway.routes.endpoint import (admit, authenticate, read_json,
                                                    settle_unless_launched, unless_disconnected)
from baton.services.gateway.routes.json_route import unknown_model
from baton.services.gateway.serving import ApiRequest, Serving, StreamedResponse
from baton.services.openai.errors import ProtocolError
from baton.services.openai.render import Choice, chat_logprob
from baton.services.openai.responses import ResponsesRequest, parse_item, renamed
from baton.services.openai.responses_output import (TERMINAL, new_id, output_items,
                                                    response_body, status_of, stored_items,
                                                    usage_of)
from baton.services.openai.responses_stream import ResponsesEventWriter
from baton.services.state.responses_repo import (StoredResponse, finish_response,
                                                 get_response, insert_response)
from baton.services.state.store import StateStore
from baton.services.state.urls import StoreUnavailable

log = logging.getLogger(__name__)
URL = "/v1/responses"


@dataclass
class Job:
    """A response being made: its request, the chat completion it runs as, and what is stored."""
    request: ResponsesRequest
    api: ApiRequest
    body: dict[str, Any]  # the response object as created (in_progress)
    inputs: list[dict[str, Any]]  # this request's input items, with ids
    conversation: list[dict[str, Any]]  # the previous conversation and the inputs

    @property
    def tenant(self) -> str:
        return self.api.tenant.name


def not_found(response_id: str, param: str | None = None) -> JSONResponse:
    return error_response(404, f"No response found with id '{response_id}'", "not_found",
                          param=param)


class ResponsesService:
    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self.gateway = serving.gateway
        self.running: dict[str, asyncio.Task] = {}  # background responses served here
        self._writes: set[asyncio.Task] = set()

    @property
    def store(self) -> StateStore:
        if self.gateway.store is None:
            raise StoreUnavailable("this gateway has no state store")
        return self.gateway.store

    async def create(self, request: Request, started: float) -> Response:
        gateway = self.gateway
        caller = authenticate(gateway, request)
        oai = ResponsesRequest.parse(await read_json(gateway, request))
        refusal = unknown_model(gateway, oai.model)
        if refusal is not None:
            return refusal
        history: list[dict[str, Any]] = []
        if oai.previous_response_id is not None:
            previous = await get_response(self.store, caller[0].name, oai.previous_response_id)
            if previous is None:
                return not_found(oai.previous_response_id, "previous_response_id")
            history = previous.conversation
        items = oai.items()
        chat = oai.chat([parse_item(raw, "conversation") for raw in history] + items)
        response_id = new_id("resp")
        try:
            api = await admit(self.serving, chat, caller, request, started, URL, response_id)
        except ProtocolError as e:
            raise renamed(e) from None
        inputs = stored_items(items)
        job = Job(oai, api, response_body(oai, response_id, api.model_name(), "in_progress", []),
                  inputs, history + inputs)
        try:
            return await self._run(job, request)
        finally:
            if response_id not in self.running:  # a background task settles its own
                settle_unless_launched(api)

    async def _run(self, job: Job, request: Request) -> Response:
        oai, response_id, inputs = job.request, job.api.response_id, job.inputs
        if oai.store:
            await insert_response(self.store, job.tenant, StoredResponse(
                response_id, "in_progress", job.body, inputs, job.conversation),
                self.gateway.response_ttl_s)
        if oai.background:
            task = asyncio.ensure_future(self._background(job))
            self.running[response_id] = task
            task.add_done_callback(lambda _: self.running.pop(response_id, None))
            return JSONResponse(job.body)
        try:
            if oai.stream:
                return await self._stream(job, request)
            return await self._collect(job, request)
        except Refused as e:
            self._abandon(job, "failed", {"code": e.code, "message": e.message})
            raise

    async def _collect(self, job: Job, request: Request) -> Response:
        states = await unless_disconnected(request, job.api, self.serving.collect(job.api))
        if states is None:
            self._abandon(job, "cancelled", None)
            return Response(status_code=CLIENT_CLOSED)
        return JSONResponse(await self._finish_collected(job, states[0]))

    async def _finish_collected(self, job: Job, state: Choice) -> dict[str, Any]:
        parser = job.api.oai.tool_parser(job.api.served.tool_parser)
        logprobs = None
        if state.logprobs is not None:
            text_of = self.serving.token_text(job.api)
            logprobs = [chat_logprob(lp, text_of) for lp in state.logprobs]
        output = output_items(state.text, parser, logprobs)
        return await self._finish(job, output, state)

    async def _finish(self, job: Job, output: list[dict[str, Any]], state: Choice,
                      error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The final response object, stored when the request asked for it."""
        status, incomplete = status_of(state.finish_reason)
        if status == "failed" and error is None:
            error = {"code": "server_error", "message": "the response could not be completed"}
        usage = usage_of(len(state.prompt_token_ids), state.num_cached_tokens,
                         len(state.token_ids))
        body = {**response_body(job.request, job.api.response_id, job.api.model_name(), status,
                                output, usage, incomplete, error),
                "created_at": job.body["created_at"]}
        if job.request.store:
            await finish_response(self.store, job.tenant, StoredResponse(
                body["id"], status, body, job.inputs, job.conversation + output),
                unless_status="cancelled")
        return body

    async def _stream(self, job: Job, request: Request) -> Response:
        running = await unless_disconnected(request, job.api, self.serving.start(job.api))
        if running is None:
            self._abandon(job, "cancelled", None)
            return Response(status_code=CLIENT_CLOSED)
        text_of = self.serving.token_text(job.api) if job.request.logprobs else None
        writer = ResponsesEventWriter(job.api.oai, job.body, job.api.served.tool_parser, text_of)
        response = StreamedResponse(self.serving, running, writer)
        response.body_iterator = self._stream_end(response.body_iterator, job, writer,
                                                  running.states[0])
        return response

    async def _stream_end(self, events: AsyncIterator[Any], job: Job,
                          writer: ResponsesEventWriter, state: Choice) -> AsyncIterator[str]:
        """The stream's events, then its last one carrying the response once stored."""
        ended = False
        try:
            async for event in events:
                yield event
            try:
                body = await self._finish(job, writer.output(), state)
            except StoreUnavailable as e:
                self.gateway.metrics.state_store_failures.labels("responses").inc()
                body = {**job.body, "status": "failed", "output": writer.output(),
                        "error": {"code": "state_store_unavailable", "message": str(e)}}
            ended = True
            kind = {"completed": "response.completed",
                    "incomplete": "response.incomplete"}.get(body["status"], "response.failed")
            yield writer.event(kind, response=body)
        finally:
            if not ended:  # the client left mid-stream
                self._abandon(job, "cancelled", None)

    async def _background(self, job: Job) -> None:
        try:
            states = await self.serving.collect(job.api)
            await self._finish_collected(job, states[0])
        except Refused as e:
            await self._finish(job, [], Choice(0, job.api.inp.prompts[0]),
                               {"code": e.code, "message": e.message})
        except StoreUnavailable as e:
            self.gateway.metrics.state_store_failures.labels("responses").inc()
            log.warning("background response %s could not be stored: %s", job.api.response_id, e)
        finally:
            settle_unless_launched(job.api)

    def _abandon(self, job: Job, status: str, error: dict[str, Any] | None) -> None:
        """Stores a response that will not finish as `status` (beside the request, which is
        ending)."""
        if not job.request.store:
            return
        body = {**job.body, "status": status, "error": error}
        task = asyncio.ensure_future(self._write_quietly(finish_response(
            self.store, job.tenant, StoredResponse(body["id"], status, body, job.inputs,
                                                   job.conversation))))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write_quietly(self, write: Any) -> None:
        try:
            await write
        except StoreUnavailable as e:
            self.gateway.metrics.state_store_failures.labels("responses").inc()
            log.warning("a response's status could not be stored: %s", e)

    async def get(self, request: Request, response_id: str) -> Response:
        tenant = authenticate(self.gateway, request)[0].name
        if request.query_params.get("stream", "false").lower() == "true":
            raise ProtocolError("streaming a stored response is not supported; GET it without "
                                "stream", param="stream", code="unsupported_parameter")
        stored = await get_response(self.store, tenant, response_id)
        return JSONResponse(stored.body) if stored is not None else not_found(response_id)

    async def cancel(self, request: Request, response_id: str) -> Response:
        tenant = authenticate(self.gateway, request)[0].name
        stored = await get_response(self.store, tenant, response_id)
        if stored is None:
            return not_found(response_id)
        if not stored.body.get("background"):
            raise ProtocolError("only background responses can be cancelled",
                                param="response_id")
        if stored.status in TERMINAL:
            return JSONResponse(stored.body)
        task = self.running.get(response_id)
        if task is not None:
            task.cancel()
        body = {**stored.body, "status": "cancelled"}
        await finish_response(self.store, tenant, StoredResponse(
            response_id, "cancelled", body, stored.input_items, stored.conversation))
        return JSONResponse(body)
