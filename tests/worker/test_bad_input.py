"""Bad requests get the right gRPC status with a message, and the worker stays healthy
afterwards."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from baton.v1 import worker_pb2 as pb
from tests.launcher import start_workers
from tests.worker.streams import collect, greedy_params


@pytest.fixture(scope="module")
def worker(tiny_model_dirs):
    [mixed] = start_workers(tiny_model_dirs["llama"], ["mixed"])
    yield mixed
    assert mixed.service.terminate() == 0


def meta(rid: str) -> pb.RequestMeta:
    return pb.RequestMeta(request_id=rid)


async def generate_error(worker, request: pb.GenerateRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in worker.stub().Generate(request):
            pass
    return caught.value


async def prefill_error(worker, request: pb.PrefillRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await worker.stub().Prefill(request)
    return caught.value


CASES = {
    "empty prompt": (pb.GenerateRequest(meta=meta("e"), params=greedy_params(4)),
                     grpc.StatusCode.INVALID_ARGUMENT, "at least one token"),
    "token id out of vocabulary": (pb.GenerateRequest(meta=meta("v"), prompt_token_ids=[1, 10**6],
                                                      params=greedy_params(4)),
                                   grpc.StatusCode.INVALID_ARGUMENT, "token ids must be in"),
    "negative temperature":
        (pb.GenerateRequest(meta=meta("t"), prompt_token_ids=[1, 2],
                            params=pb.SamplingParams(max_tokens=4, temperature=-1.0)),
         grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
    "prompt past the context": (pb.GenerateRequest(meta=meta("c"), prompt_token_ids=[5] * 5000,
                                                   params=greedy_params(4)),
                                grpc.StatusCode.INVALID_ARGUMENT, "maximum context length is"),
    "oversized message":
        (pb.GenerateRequest(meta=meta("o"), prompt_token_ids=[5] * (1 << 21),
                            params=greedy_params(4)), grpc.StatusCode.INVALID_ARGUMENT, "at most"),
    "schema that does not compile": (pb.GenerateRequest(
        meta=meta("s"), prompt_token_ids=[1, 2], params=pb.SamplingParams(
            max_tokens=4, structured_output=pb.StructuredOutput(kind="json_schema",
                                                                value='{"type": "nope"}'))),
                                     grpc.StatusCode.INVALID_ARGUMENT, "structured_output"),
    "migrated tokens that break the grammar": (pb.GenerateRequest(
        meta=meta("g"), prompt_token_ids=[1, 2], output_token_ids=[100, 101],
        params=pb.SamplingParams(
            max_tokens=8, structured_output=pb.StructuredOutput(kind="choice",
                                                                value='["yes", "no"]'))),
                                               grpc.StatusCode.INVALID_ARGUMENT, "does not follow"),
    "logit_bias id out of vocabulary":
        (pb.GenerateRequest(meta=meta("b"), prompt_token_ids=[1, 2],
                            params=pb.SamplingParams(max_tokens=4, logit_bias={10**6: 1.0})),
         grpc.StatusCode.INVALID_ARGUMENT, "logit_bias token ids"),
    "logit_bias out of range":
        (pb.GenerateRequest(meta=meta("r"), prompt_token_ids=[1, 2],
                            params=pb.SamplingParams(max_tokens=4, logit_bias={3: 250.0})),
         grpc.StatusCode.INVALID_ARGUMENT, "logit_bias"),
    "too many prompt logprobs":
        (pb.GenerateRequest(meta=meta("k"), prompt_token_ids=[1, 2],
                            params=pb.SamplingParams(max_tokens=4, prompt_logprobs=1000)),
         grpc.StatusCode.INVALID_ARGUMENT, "prompt_logprobs"),
    "unknown KV handle": (pb.GenerateRequest(
        meta=meta("h"), prompt_token_ids=[1, 2, 3], params=greedy_params(4),
        kv_handle=pb.KVHandle(request_id="never-granted", transport="nixl",
                              expires_at_unix_ms=2**62,
                              block_ids=[0])), grpc.StatusCode.NOT_FOUND, "never-granted"),
    "expired KV handle": (pb.GenerateRequest(
        meta=meta("x"), prompt_token_ids=[1, 2, 3], params=greedy_params(4),
        kv_handle=pb.KVHandle(request_id="old", transport="nixl", expires_at_unix_ms=1,
                              block_ids=[0])), grpc.StatusCode.NOT_FOUND, "expired"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_generate_gets_a_status_and_a_message(worker, case):
    request, code, text = CASES[case]
    if case == "unknown KV handle":
        # a live worker that never granted this lease
        request.kv_handle.worker_address = worker.address
    error = asyncio.run(generate_error(worker, request))
    assert error.code() == code, error.details()
    assert text in (error.details() or "")
    assert asyncio.run(collect(worker, None, f"after-{case}", [1, 2, 3], greedy_params(3)))[0]


def test_bad_prefill_and_unknown_pull(worker):
    async def scenario() -> None:
        error = await prefill_error(
            worker,
            pb.PrefillRequest(meta=meta("p"), prompt_token_ids=[1],
                              params=pb.SamplingParams(max_tokens=4, top_p=2.0)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "top_p" in error.details()
        with pytest.raises(grpc.aio.AioRpcError) as pull:
            async for _ in worker.stub().PullKV(pb.PullKVRequest(request_id="nope", block_ids=[1])):
                pass
        # a NIXL worker serves no gRPC pulls
        assert pull.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.aio.AioRpcError) as lease:
            await worker.stub().UpdateLease(pb.UpdateLeaseRequest(request_id="nope"))
        assert lease.value.code() == grpc.StatusCode.NOT_FOUND
        health = health_pb2_grpc.HealthStub(grpc.aio.insecure_channel(worker.address))
        status = await health.Check(health_pb2.HealthCheckRequest(service="baton.v1.Worker"))
        assert status.status == health_pb2.HealthCheckResponse.SERVING

    asyncio.run(scenario())
