"""The Prefill and Generate calls the gateway makes from the SamplingParams a choice carries: the
prompt's logprobs are asked of whoever computes the prompt (the prefill worker, or the decode worker
that prefills locally), never again after a hand-off or on a migration; the first token goes on with
the KV handle; and the choice's own parameters are never altered."""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.common.wire.worker import params_to_proto
from baton.services.gateway.handoff_client import stream_tokens
from baton.services.gateway.orchestrator import ChoiceRequest, Orchestrator, PrefillDeadline
from baton.v1 import router_pb2
from baton.v1 import worker_pb2 as pb

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=2)
META = pb.RequestMeta(request_id="r")


class Call:
    """A Generate stream that answers with `messages`."""

    def __init__(self, messages: list[pb.GenerateResponse]) -> None:
        self.messages = messages

    async def __aiter__(self) -> AsyncIterator[pb.GenerateResponse]:
        for message in self.messages:
            yield message

    def cancel(self) -> None:
        pass


class Worker:
    """A worker stub that records the calls it gets."""

    def __init__(self) -> None:
        self.prefills: list[pb.PrefillRequest] = []
        self.generates: list[pb.GenerateRequest] = []

    async def Prefill(self, request: pb.PrefillRequest, metadata=(),
                      timeout: float | None = None) -> pb.PrefillResponse:
        self.prefills.append(request)
        return pb.PrefillResponse(
            first_token_id=9, kv_handle=pb.KVHandle(request_id="r", block_ids=[4]),
            first_logprob=pb.TokenLogprob(token_id=9, logprob=-0.5),
            prompt_logprobs=[pb.TokenLogprob(token_id=2, logprob=-1.0)])

    def Generate(self, request: pb.GenerateRequest, metadata=()) -> Call:
        self.generates.append(request)
        return Call([pb.GenerateResponse(token_ids=[10], finished=True, finish_reason="length")])


async def _tokens(stream: AsyncIterator[pb.GenerateResponse]) -> list[pb.GenerateResponse]:
    return [message async for message in stream]


@pytest.mark.asyncio
async def test_a_hand_off_asks_the_prompts_logprobs_of_the_prefill_worker_only() -> None:
    prefill, decode = Worker(), Worker()
    messages = await _tokens(stream_tokens(decode, prefill, META, [1, 2, 3], PARAMS))
    [asked], [generate] = prefill.prefills, decode.generates
    assert prefill.generates == [] and decode.prefills == []
    assert asked.params == params_to_proto(PARAMS) and asked.params.prompt_logprobs == 2
    assert generate.params == params_to_proto(replace(PARAMS, prompt_logprobs=None))
    assert not generate.params.HasField("prompt_logprobs")
    assert (list(generate.kv_handle.block_ids), generate.first_token_id,
            generate.first_logprob.logprob, generate.first_token_streamed) == ([4], 9, -0.5, True)
    # the first token streams at once, with the prompt's logprobs; the decode worker goes on
    assert [list(m.token_ids) for m in messages] == [[9], [10]]
    assert [lp.token_id for lp in messages[0].prompt_logprobs] == [2]
    assert PARAMS.prompt_logprobs == 2


@pytest.mark.asyncio
async def test_with_stop_strings_the_first_token_waits_for_the_decode_worker() -> None:
    prefill, decode = Worker(), Worker()
    params = replace(PARAMS, stop=["."])
    messages = await _tokens(stream_tokens(decode, prefill, META, [1, 2, 3], params))
    [generate] = decode.generates
    assert not generate.first_token_streamed and list(generate.params.stop) == ["."]
    assert [list(m.token_ids) for m in messages] == [[10]]


@pytest.mark.asyncio
async def test_local_prefill_asks_the_decode_worker_for_the_prompts_logprobs() -> None:
    decode = Worker()
    await _tokens(stream_tokens(decode, None, META, [1, 2, 3], PARAMS))
    [generate] = decode.generates
    assert generate.params == params_to_proto(PARAMS) and not generate.HasField("kv_handle")


class Stubs:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def get(self, address: str) -> Worker:
        return self.worker


@pytest.mark.asyncio
async def test_a_migration_continues_after_the_tokens_streamed_without_rescoring_the_prompt():
    orchestrator = Orchestrator("127.0.0.1:1", 1, PrefillDeadline(3.0, 10.0))
    decode = Worker()
    orchestrator.workers = Stubs(decode)
    choice = ChoiceRequest("r", [1, 2, 3], PARAMS, "t", 0, "salt", None, None)
    placement = router_pb2.Placement(lease_id="l", decode_address="d:1")
    await _tokens(orchestrator._attempt(choice, placement, [5, 6], local=False))
    [generate] = decode.generates
    assert (list(generate.output_token_ids), list(generate.prompt_token_ids)) == ([5, 6], [1, 2, 3])
    assert generate.params == params_to_proto(replace(PARAMS, prompt_logprobs=None))
    assert (generate.meta.request_id, generate.meta.cache_salt) == ("r", "salt")
    assert choice.params == PARAMS
