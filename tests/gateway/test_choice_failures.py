"""A choice that fails in a way nobody planned for (here protobuf refusing a priority past int32,
what an unchecked `priority` once did) ends its request with a 500 logged once with the request id,
streamed or not, instead of leaving the request waiting forever and counted in flight. A real
gateway (tokenizer, orchestrator) whose router is never reached: the failure comes before any
call."""
from __future__ import annotations

import asyncio
import logging

import pytest

from baton.services.gateway.config import GatewayConfig
from baton.services.gateway.orchestrator import Refused
from baton.services.gateway.server import build_gateway
from baton.services.gateway.serving import ApiRequest, Serving
from baton.services.openai.endpoints import new_response_id, parse_request
from baton.services.openai.engine_input import to_engine_input

IN_FLIGHT = "baton_gateway_requests_in_flight"


async def _request(serving: Serving, stream: bool) -> ApiRequest:
    gateway = serving.gateway
    oai = parse_request("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": stream})
    served = gateway.default_model
    inp = to_engine_input(oai, served.tokenizer, served.max_model_len)
    reservation = await gateway.limiter.admit("default", None, 1000, 10)
    return ApiRequest(oai, inp, gateway.default_tenant(), 2**40, new_response_id(oai), 0.0, {},
                      reservation, served)


@pytest.mark.asyncio
@pytest.mark.parametrize("stream", [False, True])
async def test_an_unexpected_error_in_a_choice_ends_the_request_with_a_500(
        stream: bool, caplog: pytest.LogCaptureFixture) -> None:
    gateway = build_gateway(GatewayConfig(auth=False, router="127.0.0.1:1"))
    serving = Serving(gateway)
    api = await _request(serving, stream)
    with caplog.at_level(logging.INFO, logger="baton.services.gateway"):
        with pytest.raises(Refused) as refused:
            await asyncio.wait_for(serving.start(api) if stream else serving.collect(api), 10)
    assert (refused.value.status, refused.value.code) == (500, "internal_error")
    assert gateway.registry.get_sample_value(IN_FLIGHT) == 0
    # its rate-limit reservation settled too, once its choice had ended
    assert api.reservation.settled
    assert gateway.registry.get_sample_value("baton_gateway_rate_limit_reserved_tokens") == 0
    # the failure, once (the request's usage line at INFO is not one)
    logged = [r for r in caplog.records
              if api.response_id in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR and logged[0].exc_info
