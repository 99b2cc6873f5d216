"""The worker's LoadLoRAAdapter and UnloadLoRAAdapter: runtime LoRA, the gateway's fan-out of
vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter. Each refusal is a status code with the
message the gateway passes on to the client, logged once with the adapter's name."""
from __future__ import annotations

import logging

import grpc

from baton.services.engine.lora.modules import LoRAError, LoRAExists, LoRAModule, LoRANotFound
from baton.services.engine.lora.runtime import LoRAOff
from baton.services.worker.engine_loop import EngineLoop
from baton.v1 import worker_pb2 as pb

log = logging.getLogger(__name__)
# Trailing metadata of a request refused for naming an adapter this worker does not serve (any
# more): the gateway answers it 404 model_not_found, as it does an unknown model.
MODEL_NOT_FOUND = (("baton-error", "model_not_found"),)


def status_of(error: LoRAError) -> grpc.StatusCode:
    if isinstance(error, LoRAOff):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(error, LoRAExists):
        return grpc.StatusCode.ALREADY_EXISTS
    if isinstance(error, LoRANotFound):
        return grpc.StatusCode.NOT_FOUND
    return grpc.StatusCode.INVALID_ARGUMENT


async def load_adapter(loop: EngineLoop, request: pb.LoadLoRAAdapterRequest,
                       context: grpc.aio.ServicerContext) -> pb.LoadLoRAAdapterResponse:
    if not request.lora_name or not request.lora_path:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            "both lora_name and lora_path are required")
    try:
        await loop.load_lora(LoRAModule(request.lora_name, request.lora_path))
    except LoRAError as e:
        log.info("LoRA adapter %s: load refused: %s", request.lora_name, e)
        await context.abort(status_of(e), str(e))
    log.info("LoRA adapter %s loaded from %s", request.lora_name, request.lora_path)
    return pb.LoadLoRAAdapterResponse()


async def unload_adapter(loop: EngineLoop, request: pb.UnloadLoRAAdapterRequest,
                         context: grpc.aio.ServicerContext) -> pb.UnloadLoRAAdapterResponse:
    if not request.lora_name:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "lora_name is required")
    try:
        finishing = await loop.unload_lora(request.lora_name)
    except LoRAError as e:
        log.info("LoRA adapter %s: unload refused: %s", request.lora_name, e)
        await context.abort(status_of(e), str(e))
    log.info("LoRA adapter %s unloaded (%d requests finishing under it)", request.lora_name,
             finishing)
    return pb.UnloadLoRAAdapterResponse(finishing_requests=finishing)
