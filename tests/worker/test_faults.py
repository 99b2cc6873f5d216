"""The hand-off under failure: a prefill worker killed mid-hand-off, leases left to expire, clients
that go away mid-stream, and a SIGTERM drain under live streams. No request is lost and every block
comes back. Workers a test kills, stops or starts with its own flags are its own; the others are
shared by the module (starting one takes seconds)."""
from __future__ import annotations

import asyncio
import signal
import time

import grpc
import pytest

from baton.v1 import worker_pb2 as pb
from tests.engine.engine_helpers import random_prompts
from tests.launcher import Worker, start_workers, stop_all
from tests.worker.streams import collect, greedy_params


@pytest.fixture(scope="module")
def model(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="module")
def shared(model) -> dict[str, Worker]:
    """A prefill, a decode and a mixed worker (NIXL), started side by side."""
    workers = dict(zip(("prefill", "decode", "mixed"),
                       start_workers(model, ["prefill", "decode", "mixed"])))
    yield workers
    stop_all([w.service for w in workers.values()])


def wait_for(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def all_blocks_free(worker: Worker) -> bool:
    return worker.metric("baton_kv_cache_free_blocks") == worker.metric(
        "baton_kv_cache_total_blocks")


async def prefill_only(prefill: Worker, request_id: str, prompt: list[int],
                       max_tokens: int) -> pb.PrefillResponse:
    return await prefill.stub().Prefill(
        pb.PrefillRequest(meta=pb.RequestMeta(request_id=request_id), prompt_token_ids=prompt,
                          params=greedy_params(max_tokens)))


async def decode_with(decode: Worker, done: pb.PrefillResponse, request_id: str, prompt: list[int],
                      max_tokens: int) -> tuple[list[int], str]:
    request = pb.GenerateRequest(meta=pb.RequestMeta(request_id=request_id),
                                 prompt_token_ids=prompt, params=greedy_params(max_tokens),
                                 kv_handle=done.kv_handle, first_token_id=done.first_token_id)
    tokens, source = [], ""
    async for message in decode.stub().Generate(request):
        tokens += message.token_ids
        source = message.kv_source or source
    return tokens, source


def test_prefill_killed_before_transfer_still_completes(model, shared):
    decode, mixed = shared["decode"], shared["mixed"]
    [prefill] = start_workers(model, ["prefill"])  # its own: this test kills it
    fallbacks = decode.metric("baton_kv_transfer_fallbacks_total", policy="recompute")
    try:
        prompt = random_prompts(1, 500, seed=8, min_len=70, max_len=70)[0]
        expected, _ = asyncio.run(collect(mixed, None, "ref", prompt, greedy_params(12)))
        done = asyncio.run(prefill_only(prefill, "victim", prompt, 12))
        prefill.service.kill()  # kill -9: no drain, the lease's blocks vanish with the process
        tokens, source = asyncio.run(decode_with(decode, done, "victim", prompt, 12))
        assert (tokens, source) == (expected, "recompute")
        assert decode.metric("baton_kv_transfer_fallbacks_total",
                             policy="recompute") == fallbacks + 1
        wait_for(lambda: all_blocks_free(decode))
    finally:
        prefill.service.kill()


def test_lease_left_to_expire_frees_its_blocks(model):
    [prefill] = start_workers(model, ["prefill"], "nixl", "--lease-seconds", "1")
    try:
        baseline = prefill.metric("baton_kv_cache_free_blocks")
        done = asyncio.run(prefill_only(prefill, "orphan", list(range(3, 60)), 8))
        assert done.kv_handle.block_ids
        assert prefill.metric("baton_kv_cache_free_blocks") < baseline
        wait_for(lambda: prefill.metric("baton_kv_cache_free_blocks") == baseline)
        assert prefill.metric("baton_kv_lease_expiries_total") == 1
        assert prefill.metric("baton_kv_leases") == 0
    finally:
        assert prefill.service.terminate() == 0


def test_abort_mid_stream_frees_blocks_on_both_workers(shared):
    prefill, decode = shared["prefill"], shared["decode"]

    async def start_then_leave() -> int:
        prompt = list(range(10, 80))
        done = await prefill_only(prefill, "leaver", prompt, 400)
        call = decode.stub().Generate(
            pb.GenerateRequest(meta=pb.RequestMeta(request_id="leaver"),
                               prompt_token_ids=prompt, params=greedy_params(400),
                               kv_handle=done.kv_handle, first_token_id=done.first_token_id))
        seen = 0
        async for message in call:
            seen += len(message.token_ids)
            if seen >= 3:
                call.cancel()
                break
        return seen

    # a message may carry several tokens when the stream falls behind the engine
    assert 3 <= asyncio.run(start_then_leave()) < 400
    wait_for(lambda: all_blocks_free(decode) and all_blocks_free(prefill))
    assert decode.metric("baton_num_requests_running") == 0


def test_abort_frees_an_unconfirmed_lease_and_leaves_a_confirmed_one(shared):
    """The gateway aborts a prefill it gave up on: blocks no decode worker has taken over go back
    at once, while a lease a decode worker confirmed (it may be reading) stays until it releases."""
    prefill = shared["prefill"]
    # what the module's earlier tests handed off has gone back before this one starts
    wait_for(lambda: all_blocks_free(prefill) and prefill.metric("baton_kv_leases") == 0)

    async def scenario() -> tuple[bool, bool]:
        stub = prefill.stub()
        await prefill_only(prefill, "given-up", list(range(5, 60)), 8)
        given_up = await stub.Abort(pb.AbortRequest(request_id="given-up"))
        assert all_blocks_free(prefill) and prefill.metric("baton_kv_leases") == 0
        await prefill_only(prefill, "taken", list(range(7, 60)), 8)
        await stub.UpdateLease(pb.UpdateLeaseRequest(request_id="taken"))  # a decode confirms
        taken = await stub.Abort(pb.AbortRequest(request_id="taken"))
        assert not all_blocks_free(prefill) and prefill.metric("baton_kv_leases") == 1
        released = await stub.UpdateLease(pb.UpdateLeaseRequest(request_id="taken",
                                                                release=True))
        return given_up.found and taken.found, released.found

    assert asyncio.run(scenario()) == (True, True)
    assert all_blocks_free(prefill) and prefill.metric("baton_kv_leases") == 0


def test_caller_leaving_mid_pull_keeps_the_blocks_until_the_read_ends(model):
    """A Generate cancelled while its KV read is in flight: the read's thread still writes into the
    reserved blocks, so they must not go back (to be handed to another request) before it ends."""
    prefill, decode = start_workers(model, ["prefill", "decode"], "grpc",
                                    "--transfer-timeout-seconds", "5")
    try:
        async def leave_mid_pull() -> float:
            prompt = list(range(20, 90))
            done = await prefill_only(prefill, "mid-pull", prompt, 8)
            prefill.service.process.send_signal(signal.SIGSTOP)  # its PullKV answers nothing now
            call = decode.stub().Generate(
                pb.GenerateRequest(meta=pb.RequestMeta(request_id="mid-pull"),
                                   prompt_token_ids=prompt, params=greedy_params(8),
                                   kv_handle=done.kv_handle, first_token_id=done.first_token_id))
            read = asyncio.ensure_future(call.read())
            # the lease confirmation times out (5 s), then the blocks are reserved and read
            while all_blocks_free(decode):
                await asyncio.sleep(0.05)
            call.cancel()
            left = time.monotonic()
            await asyncio.gather(read, return_exceptions=True)
            await asyncio.sleep(0.5)
            assert not all_blocks_free(decode), "blocks freed while their read was in flight"
            return left

        left = asyncio.run(leave_mid_pull())
        prefill.service.process.send_signal(signal.SIGCONT)
        wait_for(lambda: all_blocks_free(decode) and all_blocks_free(prefill))
        assert time.monotonic() - left < 15
        assert decode.metric("baton_num_requests_running") == 0
    finally:
        prefill.service.process.send_signal(signal.SIGCONT)
        prefill.service.terminate()
        decode.service.terminate()


def test_sigterm_drains_eight_live_streams(model, shared):
    prefill, mixed = shared["prefill"], shared["mixed"]
    [decode] = start_workers(model, ["decode"])  # its own: this test stops it
    prompts = random_prompts(8, 500, seed=12, min_len=20, max_len=60)
    try:
        async def scenario() -> tuple[list[list[int]], grpc.StatusCode]:
            expected = [(await collect(mixed, None, f"ref{i}", p, greedy_params(60)))[0]
                        for i, p in enumerate(prompts)]
            streams = [
                asyncio.ensure_future(collect(decode, prefill, f"s{i}", p, greedy_params(60)))
                for i, p in enumerate(prompts)
            ]
            while decode.metric("baton_num_requests_running") < 8:
                await asyncio.sleep(0.05)
            decode.service.process.terminate()  # SIGTERM
            await asyncio.sleep(0.3)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await collect(decode, None, "late", prompts[0], greedy_params(4))
            assert [t for t, _ in await asyncio.gather(*streams)] == expected
            return expected, refused.value.code()

        _, code = asyncio.run(scenario())
        assert code == grpc.StatusCode.UNAVAILABLE
        assert decode.service.process.wait(30) == 0
    finally:
        decode.service.terminate()
