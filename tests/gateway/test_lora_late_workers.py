"""A LoRA adapter loaded at runtime is the fleet's desired state: a worker that registers with the
router after the load, or restarts without it, is given the adapter by the router, and requests
for it then run there token for token as under the same adapter given at start
(services/router/runtime_loras.py)."""
from __future__ import annotations

import grpc
import httpx
import openai
import pytest

from baton.services.checkpoints.tiny_lora import make_tiny_lora
from baton.v1 import router_pb2, router_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.engine.engine_helpers import random_prompts
from tests.gateway.test_lora_runtime import KEYS
from tests.launcher import launch_worker, start_stack, stop_all, wait_for

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def adapter(model, tmp_path_factory):
    return make_tiny_lora(model, tmp_path_factory.mktemp("late-lora") / "qv8", 8,
                          ("q_proj", "v_proj"), seed=1)


def _worker_args(adapter) -> tuple[str, ...]:
    return ("--num-kv-blocks=256", "--dtype=float32", "--max-loras=2",
            f"--lora-modules=qv8={adapter}")


@pytest.fixture(scope="module")
def lora_stack(model, adapter, tmp_path_factory):
    keys = tmp_path_factory.mktemp("late-lora-keys") / "keys.yaml"
    keys.write_text(KEYS)
    # a restarted worker's circuit (opened by its failed polls) is tried again within a second
    stack = start_stack(model, "colocated", api_keys_file=keys, worker_arg=_worker_args(adapter),
                        router_args=["--circuit-cooldown-s=1"],
                        gateway_args=["--allow-runtime-lora-updating", "--slos="])
    yield stack
    stack.stop()


def _tokens(client: openai.OpenAI, model: str, prompt: list[int]) -> list[int]:
    answer = client.completions.create(
        model=model, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True})
    return answer.choices[0].model_extra["token_ids"]


def _answers(client: openai.OpenAI, prompt: list[int]) -> bool:
    try:
        _tokens(client, "late", prompt)
    except openai.InternalServerError:  # 503: no worker can take it yet
        return False
    return True


def _served(address: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        stats = worker_pb2_grpc.WorkerStub(channel).GetStats(worker_pb2.GetStatsRequest(),
                                                             timeout=60)
    return set(stats.lora_adapters)


def test_a_worker_that_joins_after_a_runtime_load_serves_the_adapter(lora_stack, model,
                                                                      adapter) -> None:
    client = openai.OpenAI(base_url=lora_stack.url, api_key="sk-alpha", max_retries=0,
                           timeout=240)
    loaded = httpx.post(f"http://127.0.0.1:{lora_stack.port}/v1/load_lora_adapter",
                        json={"lora_name": "late", "lora_path": str(adapter)}, timeout=120,
                        headers={"Authorization": "Bearer sk-ops"})
    assert loaded.status_code == 200, loaded.text
    prompts = random_prompts(2, 200, seed=5, min_len=5, max_len=30)
    want = [_tokens(client, "qv8", p) for p in prompts]  # the adapter given at start
    base = client.models.list().data[0].id
    assert any(_tokens(client, base, p) != w for p, w in zip(prompts, want)), \
        "the adapter must change the outputs, or the test proves nothing"

    joined = launch_worker("mixed-worker-late", model, f"--served-model-name={model.name}",
                           f"--router={lora_stack.router.address}", *_worker_args(adapter))
    try:
        joined.service.wait_ready(120)
        # started without it (its command line names qv8 alone), it is told to load it
        wait_for(lambda: _served(joined.address) == {"qv8", "late"}, timeout=120,
                 what="the router loads the runtime adapter onto the new worker")
        told = f"LoRA adapter late loaded from {adapter}"  # the worker's log of the RPC
        wait_for(lambda: any(told in line for line in joined.service.output), timeout=60,
                 what="the worker logs the load")
        with grpc.insecure_channel(lora_stack.router.address) as channel:
            router = router_pb2_grpc.RouterStub(channel)
            listed = router.ListWorkers(router_pb2.ListWorkersRequest(), timeout=60).workers
            first = [w.worker_id for w in listed if w.address != joined.address]
            assert len(first) == 1 and len(listed) == 2
            router.Drain(router_pb2.DrainRequest(worker_ids=first), timeout=60)
        # only the new worker takes requests now
        assert [_tokens(client, "late", p) for p in prompts] == want
        generated = joined.metric("baton_lora_generation_tokens_total", lora_name="late")
        assert generated == NEW_TOKENS * len(prompts)
        # it crashes and comes back on its address: the router sees it lacks the adapter again
        joined.service.kill()
        joined.service.relaunch()
        joined.service.wait_ready(120)
        wait_for(lambda: _served(joined.address) == {"qv8", "late"}, timeout=120,
                 what="the router loads the runtime adapter onto the restarted worker")
        # its failed polls opened its circuit breaker: the router tries it again after a cooldown
        wait_for(lambda: _answers(client, prompts[0]), timeout=120,
                 what="the router places on the restarted worker again")
        assert [_tokens(client, "late", p) for p in prompts] == want
        generated = joined.metric("baton_lora_generation_tokens_total", lora_name="late")
        assert generated >= NEW_TOKENS * len(prompts)
    finally:
        stop_all([joined.service])
