"""Offline serving of OpenAI-shaped requests: all of them go to one engine at once and run to
completion together, so continuous batching packs them; a request with n > 1 is n engine
requests. A request whose `model` names one of the engine's LoRA adapters (--lora-modules) runs
under it, in the same batches as the others, and its response names the adapter; any other
`model` is the base model."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.engine.llm_engine import LLMEngine, keep_prompt_logprobs
from baton.services.openai.endpoints import OpenAIRequest, new_response_id, parse_request
from baton.services.openai.engine_input import to_engine_input
from baton.services.openai.errors import ProtocolError
from baton.services.openai.render import Choice, build_response
from baton.services.openai.tool_parsers import parser_for_model

log = logging.getLogger(__name__)


@dataclass
class _Submitted:
    request: OpenAIRequest
    response_id: str
    engine_ids: list[str]
    model: str  # what the response names: the adapter, or the base model
    outputs: dict[str, RequestOutput] = field(default_factory=dict)


def _submit(engine: LLMEngine, url: str, body: Any) -> _Submitted:
    request = parse_request(url, body)
    if request.stream:
        raise ProtocolError("stream=true is not supported for offline (batch) requests",
                            param="stream")
    inp = to_engine_input(request, engine.tokenizer, engine.max_model_len,
                          engine.config.max_logprobs, engine.model_config.vocab_size)
    response_id = new_response_id(request)
    engine_ids = [f"{response_id}-{i}" for i in range(inp.choices)]
    lora_name = _adapter(engine, request.model)
    try:
        for i, engine_id in enumerate(engine_ids):
            engine.add_request(engine_id, inp.prompt_of(i), inp.params.for_choice(i),
                               priority=inp.priority, cache_salt=inp.cache_salt,
                               lora_name=lora_name)
    except ValueError as e:
        # The engine refuses what it can never serve (e.g. more KV than it holds); drop the choices
        # already in.
        for engine_id in engine_ids:
            engine.abort_request(engine_id)
        raise ProtocolError(str(e)) from None
    return _Submitted(request, response_id, engine_ids, lora_name or engine.model_id)


def _adapter(engine: LLMEngine, model: str | None) -> str | None:
    """The LoRA adapter a request's `model` names, None for the base model."""
    if engine.lora is None or model is None or model not in engine.lora.modules:
        return None
    return model


def run_requests(engine: LLMEngine,
                 requests: list[tuple[str, Any]]) -> list[dict[str, Any] | ProtocolError]:
    """Serves (url, body) pairs; each result is a response body or the ProtocolError that refused
    it, in order."""
    results: list[dict[str, Any] | ProtocolError | _Submitted] = []
    by_engine_id: dict[str, _Submitted] = {}
    for url, body in requests:
        try:
            submitted = _submit(engine, url, body)
        except ProtocolError as e:
            results.append(e)
            continue
        results.append(submitted)
        by_engine_id.update(dict.fromkeys(submitted.engine_ids, submitted))
    log.info("running %d engine requests for %d API requests", len(by_engine_id), len(requests))
    scored: dict[str, list[TokenLogprobs | None]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            keep_prompt_logprobs(out, scored)
            if out.finished:
                by_engine_id[out.request_id].outputs[out.request_id] = out
    return [_response(engine, r) if isinstance(r, _Submitted) else r for r in results]


def _response(engine: LLMEngine, submitted: _Submitted) -> dict[str, Any]:
    choices = [Choice.of(submitted.outputs[engine_id], i)
               for i, engine_id in enumerate(submitted.engine_ids)]
    parser = parser_for_model("auto", engine.model_config.model_type, engine.tokenizer)
    return build_response(submitted.request, choices, engine.tokenizer, submitted.model,
                          submitted.response_id, parser)
