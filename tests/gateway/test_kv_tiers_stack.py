"""KV tiers through the whole stack with the official `openai` client: a prompt whose blocks other
traffic pushed out of a worker's small device cache comes back from its host tier, reported as
cached tokens, with the same greedy text; disaggregated, the prefill worker loads it from its host
tier and the decode worker too, pulling only the blocks after it."""
from __future__ import annotations

import grpc
import openai
import pytest

from baton.v1 import worker_pb2, worker_pb2_grpc
from tests.launcher import metric, start_stack, wait_for


@pytest.fixture(scope="module")
def tiered(model):
    # Eight device blocks of 16 tokens: one 80-token prompt at a time fits, two do not.
    stack = start_stack(model, "colocated", gateway_args=["--slos="],
                        worker_arg=("--num-kv-blocks=8", "--kv-offload-host-gib=0.01"))
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def tiered_pd(model):
    """The same workers disaggregated, every prompt handed off."""
    stack = start_stack(model, "disaggregated", gateway_args=["--slos="],
                        router_args=["--max-local-prefill-tokens=0"],
                        worker_arg=("--num-kv-blocks=8", "--kv-offload-host-gib=0.01"))
    yield stack
    stack.stop()


def test_evicted_prefix_comes_back_from_host_as_cached_tokens(tiered, model) -> None:
    client = openai.OpenAI(base_url=tiered.url, api_key="unused", max_retries=0)
    worker = tiered.workers()[0]

    def complete(prompt: list[int]) -> openai.types.Completion:
        return client.completions.create(model=model.name, prompt=prompt, max_tokens=4,
                                          temperature=0)

    first = complete(list(range(100, 180)))  # 80 tokens: five full blocks of 16
    assert first.usage.prompt_tokens_details is None or \
        first.usage.prompt_tokens_details.cached_tokens == 0
    for start in (200, 300):  # other prompts take every device block
        complete(list(range(start, start + 80)))
    wait_for(lambda: metric(worker, "baton_kv_tier_stored_bytes_total") > 0, 30,
             "blocks stored in the host tier")
    again = complete(list(range(100, 180)))
    # Every full block but the last comes back (the last token is computed for its logits).
    assert again.usage.prompt_tokens_details.cached_tokens == 64
    assert again.choices[0].text == first.choices[0].text
    assert metric(worker, "baton_kv_tier_hits_total") >= 64
    assert metric(worker, "baton_prefix_cache_hits_total") == 0  # none of it from the device


def test_disaggregated_second_turn_loads_from_both_host_tiers(tiered_pd, tiered, model) -> None:
    def complete(stack, prompt: list[int]) -> openai.types.Completion:
        client = openai.OpenAI(base_url=stack.url, api_key="unused", max_retries=0)
        return client.completions.create(model=model.name, prompt=prompt, max_tokens=4,
                                         temperature=0)

    prefill, decode = tiered_pd.workers("prefill")[0], tiered_pd.workers("decode")[0]
    first = list(range(10, 90))  # five full blocks, all pulled by the decode worker
    complete(tiered_pd, first)
    five_blocks = metric(decode, "baton_kv_transfer_bytes_total")
    assert five_blocks > 0
    for start in (110, 210):  # other prompts take every device block on both workers
        complete(tiered_pd, list(range(start, start + 80)))
    wait_for(lambda: all(metric(w, "baton_kv_tier_stored_bytes_total") > 0
                         for w in (prefill, decode)), 60, "blocks stored in both host tiers")
    pulled = metric(decode, "baton_kv_transfer_bytes_total")
    second = first + list(range(320, 336))  # the first turn's five blocks, then a new one
    got = complete(tiered_pd, second)
    assert got.choices[0].text == complete(tiered, second).choices[0].text
    # The prefill worker loaded the five blocks (the last token is computed for its logits)...
    assert got.usage.prompt_tokens_details.cached_tokens == 80
    assert metric(prefill, "baton_kv_tier_hits_total") >= 80
    # ... and the decode worker too, pulling only the sixth block.
    assert metric(decode, "baton_kv_tier_hits_total") >= 80
    assert metric(decode, "baton_kv_transfer_bytes_total") - pulled == five_blocks / 5
    # The router hears where those blocks are: the worker's events and snapshot name the tier.
    with grpc.insecure_channel(decode.address) as channel:
        stub = worker_pb2_grpc.WorkerStub(channel)
        snapshot = stub.GetKVSnapshot(worker_pb2.GetKVSnapshotRequest(), timeout=60)
        assert snapshot.host_block_hashes
        stream = stub.StreamKVEvents(worker_pb2.StreamKVEventsRequest(), timeout=60)
        host = next(e for batch in stream for e in batch.events
                    if e.medium == worker_pb2.KV_MEDIUM_HOST)
        stream.cancel()
        assert host.kind == worker_pb2.KVEvent.KIND_STORED
