"""vLLM's runtime LoRA endpoints through a whole stack (gateway, router, worker) with the official
client: POST /v1/load_lora_adapter and /v1/unload_lora_adapter answer only admin keys, and only
with --allow-runtime-lora-updating; an adapter loaded at runtime answers what the same adapter
given at start answers; an unload lets a running stream finish while later requests get 404; every
bad adapter is an OpenAI error naming why, and the stack goes on serving; base-model requests sent
while adapters come and go all complete; a request between its prefill and its decode when the
unload lands still decodes under the adapter."""
from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import openai
import pytest

from baton.services.checkpoints.tiny_lora import make_tiny_lora
from baton.services.common.sampling_params import SamplingParams
from baton.services.common.wire.worker import generate_request, handoff_request, prefill_request
from baton.v1 import worker_pb2, worker_pb2_grpc
from tests.engine.engine_helpers import random_prompts
from tests.engine.lora_helpers import make_bad_adapters
from tests.launcher import start_stack, wait_for

KEYS = """
tenants:
  - name: ops
    keys: ["sk-ops"]
    admin: true
  - name: alpha
    keys: ["sk-alpha"]
"""
NEW_TOKENS = 8
# Long enough that the stream is still running when the unload, sent after its first chunk, lands.
STREAM_TOKENS = 600


@pytest.fixture(scope="module")
def adapter(model, tmp_path_factory):
    return make_tiny_lora(model, tmp_path_factory.mktemp("runtime-lora") / "qv8", 8,
                          ("q_proj", "v_proj"), seed=1)


@pytest.fixture(scope="module")
def lora_stack(model, adapter, tmp_path_factory):
    keys = tmp_path_factory.mktemp("lora-keys") / "keys.yaml"
    keys.write_text(KEYS)
    stack = start_stack(
        model, "colocated", api_keys_file=keys,
        worker_arg=("--num-kv-blocks=256", "--dtype=float32", "--max-loras=2",
                    f"--lora-modules=qv8={adapter}"),
        gateway_args=["--allow-runtime-lora-updating", "--slos="])
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def admin(lora_stack):
    with httpx.Client(base_url=f"http://127.0.0.1:{lora_stack.port}", timeout=120,
                      headers={"Authorization": "Bearer sk-ops"}) as session:
        yield session


@pytest.fixture(scope="module")
def client(lora_stack):
    return openai.OpenAI(base_url=lora_stack.url, api_key="sk-alpha", max_retries=0, timeout=240)


def _models(client: openai.OpenAI) -> set[str]:
    return {m.id for m in client.models.list().data}


def _tokens(client: openai.OpenAI, model: str, prompt: list[int]) -> list[int]:
    answer = client.completions.create(
        model=model, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True})
    return answer.choices[0].model_extra["token_ids"]


def _error(response: httpx.Response) -> dict:
    return response.json()["error"]


def test_refused_without_an_admin_key(lora_stack, admin) -> None:
    body = {"lora_name": "x", "lora_path": "/nowhere"}
    for url in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        anonymous = httpx.post(admin.base_url.join(url), json=body, timeout=60)
        assert anonymous.status_code == 401, anonymous.text
        tenant = httpx.post(admin.base_url.join(url), json=body, timeout=60,
                            headers={"Authorization": "Bearer sk-alpha"})
        assert tenant.status_code == 403, tenant.text
        assert _error(tenant)["code"] == "permission_denied"
        assert "admin key" in _error(tenant)["message"]


def test_refused_without_the_flag(disaggregated) -> None:
    answer = httpx.post(f"http://127.0.0.1:{disaggregated.port}/v1/load_lora_adapter",
                        json={"lora_name": "x", "lora_path": "/nowhere"}, timeout=60,
                        headers={"Authorization": "Bearer sk-alpha"})
    assert answer.status_code == 404, answer.text
    assert "--allow-runtime-lora-updating" in _error(answer)["message"]


def test_loaded_at_runtime_answers_as_given_at_start(client, admin, adapter) -> None:
    loaded = admin.post("/v1/load_lora_adapter",
                        json={"lora_name": "qv8-rt", "lora_path": str(adapter)})
    assert loaded.status_code == 200, loaded.text
    assert loaded.text == "Success: LoRA adapter 'qv8-rt' added successfully."
    card = client.models.retrieve("qv8-rt")
    assert card.model_extra["parent"] == client.models.retrieve("qv8").model_extra["parent"]
    prompts = random_prompts(2, 200, seed=3, min_len=5, max_len=30)
    base = client.models.list().data[0].id
    got = {(name, i): _tokens(client, name, p) for name in ("qv8", "qv8-rt", base)
           for i, p in enumerate(prompts)}
    for i in range(len(prompts)):
        assert got[("qv8-rt", i)] == got[("qv8", i)]
    assert any(got[(base, i)] != got[("qv8", i)] for i in range(len(prompts))), \
        "the adapter must change the outputs, or the test proves nothing"
    wait_for(lambda: "qv8-rt" in _models(client), timeout=60, what="qv8-rt in /v1/models")


def test_unload_while_streaming(client, admin, adapter) -> None:
    assert admin.post("/v1/load_lora_adapter",
                      json={"lora_name": "streamed", "lora_path": str(adapter)}).status_code == 200
    stream = client.completions.create(
        model="streamed", prompt="Once upon a time", max_tokens=STREAM_TOKENS, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    next(chunks)  # the request runs on the worker now
    unloaded = admin.post("/v1/unload_lora_adapter", json={"lora_name": "streamed"})
    assert unloaded.status_code == 200, unloaded.text
    assert "1 running request finishes first" in unloaded.text
    with pytest.raises(openai.NotFoundError) as refused:
        client.completions.create(model="streamed", prompt="hi", max_tokens=2)
    assert refused.value.body["code"] == "model_not_found"
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage[-1].completion_tokens == STREAM_TOKENS
    assert "streamed" not in _models(client)
    gone = admin.post("/v1/unload_lora_adapter", json={"lora_name": "streamed"})
    assert gone.status_code == 404, gone.text


@pytest.mark.parametrize("case", ["rank", "targets", "other-model", "truncated", "corrupt"])
def test_bad_adapters_are_400_and_serving_goes_on(client, admin, tiny_model_dirs,
                                                  tmp_path, case) -> None:
    path, message = make_bad_adapters(tiny_model_dirs, tmp_path)[case]
    answer = admin.post("/v1/load_lora_adapter", json={"lora_name": f"bad-{case}",
                                                       "lora_path": str(path)})
    assert answer.status_code == 400, answer.text
    error = _error(answer)
    assert error["type"] == "invalid_request_error"
    assert re.search(message, error["message"]), error["message"]
    assert f"bad-{case}" not in _models(client)
    assert len(_tokens(client, "qv8", [5, 6, 7])) == NEW_TOKENS


def test_bad_requests(client, admin, adapter) -> None:
    exists = admin.post("/v1/load_lora_adapter", json={"lora_name": "qv8",
                                                       "lora_path": str(adapter)})
    assert exists.status_code == 400 and "already been loaded" in _error(exists)["message"]
    unknown = admin.post("/v1/unload_lora_adapter", json={"lora_name": "never-loaded"})
    assert unknown.status_code == 404, unknown.text
    assert "'never-loaded' is not served here" in _error(unknown)["message"]
    for body, param in (({"lora_name": "x"}, "lora_path"), ({"lora_path": "/x"}, "lora_name"),
                        ({"lora_name": "x", "lora_path": "/x", "load_inplace": True},
                         "load_inplace")):
        answer = admin.post("/v1/load_lora_adapter", json=body)
        assert answer.status_code == 400 and _error(answer)["param"] == param, answer.text
    base = client.models.list().data[0].id
    no_base = admin.post("/v1/load_lora_adapter", json={"lora_name": "x", "base_model_name": "nope",
                                                        "lora_path": str(adapter)})
    assert no_base.status_code == 404 and _error(no_base)["param"] == "base_model_name"
    named_as_base = admin.post("/v1/load_lora_adapter", json={"lora_name": base,
                                                              "lora_path": str(adapter)})
    assert named_as_base.status_code == 400 and "base model" in _error(named_as_base)["message"]
    missing = admin.post("/v1/load_lora_adapter", json={"lora_name": "x",
                                                        "lora_path": "/no/such/folder"})
    assert missing.status_code == 400 and "not a folder" in _error(missing)["message"]
    assert len(_tokens(client, "qv8", [5, 6, 7])) == NEW_TOKENS


def test_load_and_unload_under_load_lose_no_request(client, admin, adapter) -> None:
    base = client.models.list().data[0].id
    prompts = random_prompts(24, 200, seed=9, min_len=5, max_len=30)
    stop, changes = threading.Event(), []

    def churn() -> None:
        while not stop.is_set():
            for path, body in (("load", {"lora_name": "churn", "lora_path": str(adapter)}),
                               ("unload", {"lora_name": "churn"})):
                changes.append(admin.post(f"/v1/{path}_lora_adapter", json=body).status_code)

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda p: _tokens(client, base, p), prompts))
    finally:
        stop.set()
        churner.join(timeout=300)
    assert [len(a) for a in answers] == [NEW_TOKENS] * len(prompts)
    assert changes and set(changes) == {200}, changes


def test_a_worker_refuses_an_adapter_it_does_not_serve_as_not_found(lora_stack) -> None:
    """What a request gets that reaches a worker after an unload, before the gateway knows:
    NOT_FOUND marked model_not_found, which the gateway answers 404 (orchestrator.py's refusal
    mapping)."""
    [worker] = lora_stack.workers()
    meta = worker_pb2.RequestMeta(request_id="gone-adapter", lora_name="never-loaded")
    request = generate_request(meta, [5, 6, 7], SamplingParams(max_tokens=2))
    with grpc.insecure_channel(worker.address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            list(worker_pb2_grpc.WorkerStub(channel).Generate(request, timeout=60))
    error = refused.value
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert ("baton-error", "model_not_found") in tuple(error.trailing_metadata())
    assert "'never-loaded' is not served here" in error.details()


@pytest.fixture(scope="module")
def handoff_lora_stack(model, adapter, tmp_path_factory):
    """Disaggregated, every prompt prefilled on the prefill worker and handed off: a load and an
    unload reach both workers, and the decode worker runs the adapter the hand-off names."""
    keys = tmp_path_factory.mktemp("lora-keys") / "keys.yaml"
    keys.write_text(KEYS)
    stack = start_stack(
        model, "disaggregated", api_keys_file=keys, router_args=["--max-local-prefill-tokens=0"],
        worker_arg=("--num-kv-blocks=256", "--dtype=float32", "--max-loras=2",
                    f"--lora-modules=qv8={adapter}"),
        gateway_args=["--allow-runtime-lora-updating", "--slos="])
    yield stack
    stack.stop()


def _served_by_each(stack) -> list[set[str]]:
    served = []
    for worker in stack.workers():
        with grpc.insecure_channel(worker.address) as channel:
            stats = worker_pb2_grpc.WorkerStub(channel).GetStats(worker_pb2.GetStatsRequest(),
                                                                 timeout=60)
        served.append(set(stats.lora_adapters))
    return served


def test_every_worker_loads_and_unloads_and_the_handoff_runs_it(handoff_lora_stack,
                                                                adapter) -> None:
    stack = handoff_lora_stack
    client = openai.OpenAI(base_url=stack.url, api_key="sk-alpha", max_retries=0, timeout=240)
    with httpx.Client(base_url=f"http://127.0.0.1:{stack.port}", timeout=120,
                      headers={"Authorization": "Bearer sk-ops"}) as admin:
        loaded = admin.post("/v1/load_lora_adapter",
                            json={"lora_name": "qv8-rt", "lora_path": str(adapter)})
        assert loaded.status_code == 200, loaded.text
        assert _served_by_each(stack) == [{"qv8", "qv8-rt"}] * 2
        prompt = random_prompts(1, 200, seed=4, min_len=5, max_len=30)[0]
        assert _tokens(client, "qv8-rt", prompt) == _tokens(client, "qv8", prompt)
        assert admin.post("/v1/unload_lora_adapter",
                          json={"lora_name": "qv8-rt"}).status_code == 200
    assert _served_by_each(stack) == [{"qv8"}] * 2
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="qv8-rt", prompt="hi", max_tokens=2)


def _worker_stub(channel: grpc.Channel) -> worker_pb2_grpc.WorkerStub:
    return worker_pb2_grpc.WorkerStub(channel)


def test_unload_between_prefill_and_decode_keeps_the_handoff(handoff_lora_stack,
                                                             adapter) -> None:
    """The P/D race, made deterministic by driving the two calls the gateway makes: the prefill
    worker admits the request, the unload reaches both workers, then the hand-off reaches the
    decode worker, which runs it under the adapter (token for token the start-up adapter's)."""
    stack = handoff_lora_stack
    client = openai.OpenAI(base_url=stack.url, api_key="sk-alpha", max_retries=0, timeout=240)
    prompt = random_prompts(1, 200, seed=6, min_len=5, max_len=30)[0]
    want = _tokens(client, "qv8", prompt)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    meta = worker_pb2.RequestMeta(request_id="between", lora_name="raced")
    [prefill], [decode] = stack.workers("prefill"), stack.workers("decode")
    with httpx.Client(base_url=f"http://127.0.0.1:{stack.port}", timeout=120,
                      headers={"Authorization": "Bearer sk-ops"}) as admin, \
            grpc.insecure_channel(prefill.address) as to_prefill, \
            grpc.insecure_channel(decode.address) as to_decode:
        assert admin.post("/v1/load_lora_adapter", json={
            "lora_name": "raced", "lora_path": str(adapter)}).status_code == 200
        done = _worker_stub(to_prefill).Prefill(prefill_request(meta, prompt, params),
                                                timeout=120)
        unloaded = admin.post("/v1/unload_lora_adapter", json={"lora_name": "raced"})
        assert unloaded.status_code == 200, unloaded.text
        assert _served_by_each(stack) == [{"qv8"}] * 2
        handoff = handoff_request(meta, prompt, params, done, first_token_streamed=False)
        got = [t for m in _worker_stub(to_decode).Generate(handoff, timeout=120)
               for t in m.token_ids]
        assert got == want
        with pytest.raises(grpc.RpcError) as refused:  # a new request is refused as before
            list(_worker_stub(to_decode).Generate(
                generate_request(worker_pb2.RequestMeta(request_id="after", lora_name="raced"),
                                 prompt, params), timeout=120))
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
