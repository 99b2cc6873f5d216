"""POST /v1/load_lora_adapter {"lora_name", "lora_path"} and POST /v1/unload_lora_adapter
{"lora_name"} (vLLM's runtime LoRA endpoints, with its plain-text answers), fanned out to the
workers (services/gateway/lora_updates.py).

They change what every client is served, so they are refused unless the gateway was started with
--allow-runtime-lora-updating (404 otherwise, as vLLM answers without
VLLM_ALLOW_RUNTIME_LORA_UPDATING) and called with an admin key (`admin: true` in the API keys file):
401 without a valid key, 403 with a key that is not an admin's or with auth off (no key can be)."""
from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from baton.services.gateway.errors import error_response
from baton.services.gateway.lora_updates import LoRAUpdates, UpdateFailed
from baton.services.gateway.routes.json_route import answer, request_body
from baton.services.gateway.served_model import ServedModel
from baton.services.gateway.state import Gateway
from baton.services.gateway.tenants import AuthError
from baton.services.openai.errors import ProtocolError, from_validation_error

log = logging.getLogger(__name__)
LOAD_URL, UNLOAD_URL = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # vLLM's request also carries an unused lora_int_id
    lora_name: str = Field(min_length=1, max_length=256)


class LoadLoRAAdapterRequest(UnloadLoRAAdapterRequest):
    lora_path: str = Field(min_length=1, max_length=4096)
    load_inplace: bool = False  # vLLM's: replace an adapter of that name; refused here
    # which base model's workers take it (as in --lora-modules' JSON form); unset: --model's
    base_model_name: str | None = None


def _parse(model: type[BaseModel], body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise from_validation_error(e) from None


def _base_model(gateway: Gateway, options: LoadLoRAAdapterRequest) -> ServedModel:
    """The base model a load names; ProtocolError for a name that is not one, or an adapter's
    name that is a base model's."""
    if options.lora_name in gateway.models:
        raise ProtocolError(f"`{options.lora_name}` is the name of a base model served here",
                            param="lora_name")
    if options.base_model_name is None:
        return gateway.default_model
    model = gateway.models.get(options.base_model_name)
    if model is None:
        raise ProtocolError(f"no base model `{options.base_model_name}` is served here",
                            param="base_model_name", code="model_not_found", status=404)
    return model


def refusal(gateway: Gateway, request: Request) -> Response | None:
    """The answer when the flag is off or the caller is not an admin (None: go on)."""
    if not gateway.config.allow_runtime_lora_updating:
        return error_response(404, "runtime LoRA updating is off; start the gateway with "
                                   "--allow-runtime-lora-updating", "not_found")
    if gateway.keys is None:
        return error_response(403, "runtime LoRA updating needs an admin key, and auth is off",
                              "permission_denied")
    try:
        tenant = gateway.keys.tenant_for(request.headers.get("authorization"))
    except AuthError as e:
        return error_response(401, str(e), "invalid_api_key")
    if not tenant.admin:
        return error_response(403, "loading and unloading LoRA adapters needs an admin key",
                              "permission_denied")
    return None


def _log_refused(request_id: str, url: str, error: UpdateFailed) -> None:
    """Once per request; a warning when the fleet or the store failed it, not the client."""
    log.log(logging.WARNING if error.status >= 500 else logging.INFO,
            "request %s: %s refused: %s", request_id, url, error.detail)


def _updates(gateway: Gateway) -> LoRAUpdates:
    orchestrator = gateway.orchestrator
    return LoRAUpdates(orchestrator.channel, orchestrator.workers, gateway.lora_record)


def routes(gateway: Gateway) -> APIRouter:
    router = APIRouter()
    updates = _updates(gateway)

    async def guarded(url: str, request: Request,
                      update: Callable[[str, Any], Awaitable[str]]) -> Response:
        refused = refusal(gateway, request)
        if refused is not None:
            gateway.metrics.requests.labels(url, str(refused.status_code)).inc()
            return refused
        request_id = f"lora-{uuid.uuid4().hex}"

        async def work(body: Any) -> Response:
            try:
                return PlainTextResponse(await update(request_id, body))
            except UpdateFailed as e:
                _log_refused(request_id, url, e)
                return error_response(e.status, e.message, e.code,
                                      param="lora_name" if e.status < 500 else None)

        return await answer(gateway, url, request, work)

    async def load(request_id: str, body: Any) -> str:
        options = _parse(LoadLoRAAdapterRequest, body)
        if options.load_inplace:
            raise ProtocolError("load_inplace is not supported; unload the adapter, then load it",
                                param="load_inplace")
        await updates.load(request_id, _base_model(gateway, options), options.lora_name,
                           options.lora_path)
        log.info("request %s: LoRA adapter %s loaded from %s", request_id, options.lora_name,
                 options.lora_path)
        return f"Success: LoRA adapter '{options.lora_name}' added successfully."

    async def unload(request_id: str, body: Any) -> str:
        options = _parse(UnloadLoRAAdapterRequest, body)
        # the base model whose adapter it is (the default model's workers for a name this
        # gateway has not heard of yet: another gateway may have just loaded it)
        model = next((m for m in gateway.models.values()
                      if options.lora_name in m.lora_adapters), gateway.default_model)
        finishing = await updates.unload(request_id, model, options.lora_name)
        log.info("request %s: LoRA adapter %s unloaded; %d requests finishing under it",
                 request_id, options.lora_name, finishing)
        text = f"Success: LoRA adapter '{options.lora_name}' removed successfully."
        if finishing == 1:
            text += " 1 running request finishes first."
        elif finishing:
            text += f" {finishing} running requests finish first."
        return text

    @router.post(LOAD_URL, response_class=PlainTextResponse,
                 openapi_extra=request_body(LoadLoRAAdapterRequest))
    async def load_route(request: Request) -> Response:
        return await guarded(LOAD_URL, request, load)

    @router.post(UNLOAD_URL, response_class=PlainTextResponse,
                 openapi_extra=request_body(UnloadLoRAAdapterRequest))
    async def unload_route(request: Request) -> Response:
        return await guarded(UNLOAD_URL, request, unload)

    return router
