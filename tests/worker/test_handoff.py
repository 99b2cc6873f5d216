"""Token-exact KV hand-off between real worker processes: prefill on one, decode on another, over
NIXL (UCX on loopback) and over the gRPC transport, against a mixed worker and `baton run-batch` on
the same checkpoint. The tests share one NIXL prefill/decode pair (starting one takes seconds);
counters are read as differences."""
from __future__ import annotations

import asyncio
import json
import signal

import pytest

from baton.services.cli.main import main
from baton.services.common.wire.worker import params_from_proto
from baton.services.gateway.handoff_client import stream_tokens
from baton.v1 import worker_pb2 as pb
from tests.engine.engine_helpers import random_prompts
from tests.launcher import start_workers
from tests.worker.streams import collect, greedy_params, run_all

NUM_PROMPTS = 64
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def model(tiny_model_dirs):
    return tiny_model_dirs["qwen2"]


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(NUM_PROMPTS, 500, seed=21, min_len=1, max_len=90)


@pytest.fixture(scope="module")
def mixed(model):
    [worker] = start_workers(model, ["mixed"])
    yield worker
    assert worker.service.terminate() == 0


@pytest.fixture(scope="module")
def nixl_pair(model):
    prefill, decode = start_workers(model, ["prefill", "decode"])
    yield prefill, decode
    assert [prefill.service.terminate(), decode.service.terminate()] == [0, 0]


@pytest.fixture(scope="module")
def run_batch_tokens(model, prompts, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run-batch")
    src, dst = tmp / "in.jsonl", tmp / "out.jsonl"
    src.write_text("".join(
        json.dumps({
            "custom_id": str(i), "method": "POST", "url": "/v1/completions", "body": {
                "model": "m", "prompt": p, "max_tokens": NEW_TOKENS, "temperature": 0,
                "ignore_eos": True, "return_token_ids": True
            }
        }) + "\n" for i, p in enumerate(prompts)))
    assert main([
        "run-batch", "-i",
        str(src), "-o",
        str(dst), "--model",
        str(model), "--num-kv-blocks", "256"
    ]) == 0
    return [
        json.loads(line)["response"]["body"]["choices"][0]["token_ids"]
        for line in dst.read_text().splitlines()
    ]


@pytest.mark.parametrize("transport", ["nixl", "grpc"])
def test_disaggregated_matches_mixed_and_run_batch(model, prompts, mixed, run_batch_tokens,
                                                   transport, request):
    own = transport != "nixl"  # the gRPC transport's pair is this test's alone
    prefill, decode = (start_workers(model, ["prefill", "decode"], transport) if own
                       else request.getfixturevalue("nixl_pair"))
    try:
        params = greedy_params(NEW_TOKENS)
        disaggregated = asyncio.run(run_all(decode, prefill, prompts, params, transport))
        colocated = asyncio.run(run_all(mixed, None, prompts, params, f"mixed-{transport}"))
        assert {source for _, source in disaggregated} == {"transfer"}
        assert [t for t, _ in disaggregated] == [t for t, _ in colocated] == run_batch_tokens
        assert decode.metric("baton_kv_transfer_bytes_total") > 0
        assert prefill.metric("baton_kv_leases") == 0
        assert decode.metric("baton_kv_cache_free_blocks") == decode.metric(
            "baton_kv_cache_total_blocks")
    finally:
        if own:
            assert [prefill.service.terminate(), decode.service.terminate()] == [0, 0]


def test_second_request_moves_only_missing_blocks(nixl_pair):
    prefill, decode = nixl_pair
    shared = random_prompts(1, 500, seed=3, min_len=96, max_len=96)[0]  # six full blocks of 16
    hits = decode.metric("baton_prefix_cache_hits_total")
    moved = []
    for i, tail in enumerate(([1, 2, 3, 4, 5], [9, 8, 7])):
        before = decode.metric("baton_kv_transfer_bytes_total")
        asyncio.run(collect(decode, prefill, f"share-{i}", shared + tail, greedy_params(4)))
        moved.append(decode.metric("baton_kv_transfer_bytes_total") - before)
    # First: 6 full blocks and 1 partial; second: only its own partial last block.
    block_bytes = moved[0] / 7
    assert moved[1] == block_bytes
    assert decode.metric("baton_prefix_cache_hits_total") - hits >= 96


def test_first_token_streams_before_the_hand_off(prompts, mixed, nixl_pair):
    """The prefill's first token reaches the caller while the decode worker cannot even answer
    (stopped); the rest follows once it runs, token for token as colocated. With stop strings the
    first token waits for the decode worker, whose detokenizer decides what text a stop cuts."""
    prefill, decode = nixl_pair
    # a prompt the pair has not seen, so its decode worker has none of it cached
    prompt = random_prompts(1, 500, seed=5, min_len=60, max_len=60)[0]
    assert prompt not in prompts
    expected, _ = asyncio.run(collect(mixed, None, "early-ref", prompt,
                                      greedy_params(NEW_TOKENS)))

    async def first_then_rest(with_stop: bool) -> tuple[pb.GenerateResponse | None, list[int]]:
        p = greedy_params(NEW_TOKENS)
        if with_stop:
            p.stop.append("<never>")
        stream = stream_tokens(decode.stub(), prefill.stub(),
                               pb.RequestMeta(request_id=f"early-{with_stop}"), prompt,
                               params_from_proto(p))
        decode.service.process.send_signal(signal.SIGSTOP)
        try:
            first = await asyncio.wait_for(anext(stream), 3 if with_stop else 60)
        except TimeoutError:
            return None, []
        finally:
            decode.service.process.send_signal(signal.SIGCONT)
        return first, [t async for m in stream for t in m.token_ids]

    moved = decode.metric("baton_kv_transfer_bytes_total")
    first, rest = asyncio.run(first_then_rest(with_stop=False))
    assert list(first.token_ids) == expected[:1] and first.kv_source == "local"
    assert rest == expected[1:]
    assert decode.metric("baton_kv_transfer_bytes_total") > moved
    assert asyncio.run(first_then_rest(with_stop=True)) == (None, [])
