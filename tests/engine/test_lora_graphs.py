"""LoRA adapters inside the decode graphs. On CPU the buckets run as enforce_eager runs them on
CUDA (the same buffers, adapter-index buffer included, without a graph; Triton attention in
interpreter mode): a batch of three adapters and the base model decodes through them token for
token as transformers + peft and as the unbucketed path; LoRA decode steps take a bucket; a slot
reloaded between steps is what the next bucketed step reads, the stacks never reallocated; a
follower rank fills the same adapter indices from rank 0's step message and replays the same
variant. On a GPU the captured graphs with adapters are checked against enforce_eager."""
from __future__ import annotations

import pytest
import torch

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.cuda_graphs import DecodeBatch
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.lora.replicas import (LoRAEvent, LoRAFollower, LoRAReplicas,
                                                 ReadAdapter)
from baton.services.engine.parallel.step_sync import (MirrorItem, MirrorSeq, StepDecoder,
                                                      StepEncoder)
from tests.engine.engine_helpers import random_prompts
from tests.engine.lora_helpers import (assert_matches, greedy_reference, make_adapters,
                                       reference_model)
from tests.engine.tp_graph_helpers import spy_runs

# Triton runs CPU tensors only in interpreter mode, which a CUDA machine's test run does not use.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEW_TOKENS = 5
ENGINE = dict(dtype="float32", device=DEVICE, attention_backend="triton", num_kv_blocks=64,
              max_model_len=128, max_num_batched_tokens=128, cuda_graph_max_batch_size=4,
              num_threads=1, enforce_eager=True)


@pytest.fixture(scope="module")
def case(tiny_model_dirs, tmp_path_factory) -> dict:
    """One prompt per adapter and one for the base; transformers + peft's greedy tokens."""
    model_dir = tiny_model_dirs["llama"]
    adapters = make_adapters(model_dir, tmp_path_factory.mktemp("graph-adapters"))
    names = [None, *adapters]
    prompts = dict(zip(names, random_prompts(len(names), 200, seed=11, min_len=5, max_len=20)))
    want = {name: greedy_reference(reference_model(model_dir, adapters.get(name)), prompts[name],
                                   NEW_TOKENS) for name in names}
    return {"model": model_dir, "adapters": adapters, "prompts": prompts, "want": want}


def _engine(case: dict, **kwargs) -> LLMEngine:
    modules = [f"{name}={path}" for name, path in case["adapters"].items()]
    return LLMEngine(EngineConfig(model=str(case["model"]), lora_modules=modules,
                                  **{**ENGINE, **kwargs}))


def _run(engine: LLMEngine, case: dict) -> dict[str | None, list[int]]:
    """Every prompt at once; the base's stops a token early, so the last steps pad a row."""
    done = {}
    for name, prompt in case["prompts"].items():
        tokens = NEW_TOKENS - 1 if name is None else NEW_TOKENS
        engine.add_request(str(name), prompt, SamplingParams(max_tokens=tokens, temperature=0.0,
                                                             ignore_eos=True), lora_name=name)
    while engine.has_unfinished_requests():
        done.update({out.request_id: out.token_ids for out in engine.step() if out.finished})
    return {name: done[str(name)] for name in case["prompts"]}


def _check_peft(got: dict, case: dict) -> None:
    for name, tokens in got.items():
        want, gaps = case["want"][name]
        n = len(tokens)
        assert_matches(tokens, want[:n], gaps[:n], f"adapter {name} through the decode buckets")


@pytest.fixture(scope="module")
def bucketed(case) -> tuple[LLMEngine, list[DecodeBatch], dict]:
    """A TP=1 engine after decoding the batch through its buckets; what it ran, its tokens."""
    engine = _engine(case, max_loras=3)
    runs = spy_runs(engine.runner.graphs)
    got = _run(engine, case)
    return engine, [batch for batch, _ in runs], got


def test_mixed_batch_through_the_buckets_matches_peft_and_unbucketed(case, bucketed):
    engine, batches, got = bucketed
    _check_peft(got, case)
    unbucketed = _engine(case, max_loras=3)
    unbucketed.runner.graphs = None  # every step packed as prefill steps are
    assert _run(unbucketed, case) == got
    graphs = engine.runner.graphs
    assert graphs.lora_replays > 0 and graphs.replays == len(batches)
    mixed = [b.adapters for b in batches if b.adapters is not None]
    assert any(len(set(a)) == 4 for a in mixed), "no step mixed three adapters and the base"
    assert any(len(a) == 3 for a in mixed), "no LoRA step padded a row"
    assert graphs.inputs.adapters[3] == -1  # the padding row's, which adds no delta


def _item(tokens: int = 1, lora: int | None = None) -> MirrorItem:
    return MirrorItem(MirrorSeq(20, [7] * (20 + tokens), [0, 1], False, lora), tokens, True)


def test_lora_decode_steps_take_a_bucket(bucketed):
    runner = bucketed[0].runner
    assert runner._decode_bucket([_item(lora=0)]) == 1
    assert runner._decode_bucket([_item(), _item(lora=2), _item(lora=1)]) == 4
    assert runner._decode_bucket([_item(lora=0), _item(tokens=4, lora=1)]) is None  # prefill


def _stacks(engine: LLMEngine) -> list[int]:
    """The addresses the graphs read adapters from."""
    lora = engine.runner.lora
    ptrs = [lora.scales.data_ptr()]
    for layer in lora.layers.values():
        ptrs += [t.data_ptr() for t in (*layer.a.values(), *layer.b.values())]
    return ptrs


def test_a_slot_reloaded_between_steps_is_what_the_next_step_reads(case):
    # One slot for three adapters: they take turns, each copied over the last between steps.
    engine = _engine(case, max_loras=1, max_cpu_loras=1)
    before = _stacks(engine)
    _check_peft(_run(engine, case), case)
    assert engine.stats().lora.slot_loads == len(case["adapters"])
    assert engine.runner.graphs.lora_replays > 0
    assert _stacks(engine) == before


class _Mirror:
    """Rank 0's executor stand-in: LoRA events to a follower's slots, step messages to its
    runner, as a follower rank's loop hands them over."""

    def __init__(self, follower: LLMEngine) -> None:
        self.runner = follower.runner
        self.lora = LoRAFollower(follower.config, follower.model_config, self.runner.lora)
        self.decoder, self.buckets = StepDecoder(), []

    def send(self, message) -> None:
        if isinstance(message, LoRAEvent):
            self.lora.apply(message)
            return
        self.buckets.append(message.bucket)
        self.runner.execute_follower(self.decoder.decode(message), message.score_rows,
                                     message.bucket)

    def close(self) -> None:
        self.lora.close()


def test_a_follower_fills_the_same_adapter_indices_and_replays_the_same_variant(case):
    leader, follower = _engine(case, max_loras=3), _engine(case, max_loras=3)
    mirror = _Mirror(follower)
    leader.runner.executor, leader.runner.encoder = mirror, StepEncoder()
    leader.lora.replicas = LoRAReplicas(mirror.send)
    for module in leader.lora.modules.values():  # registered before the mirror was there
        mirror.send(ReadAdapter(module))
    ours, theirs = spy_runs(leader.runner.graphs), spy_runs(follower.runner.graphs)
    _check_peft(_run(leader, case), case)
    assert [b.adapters for b, _ in ours] == [b.adapters for b, _ in theirs]
    assert any(b.adapters for b, _ in theirs) and any(b is not None for b in mirror.buckets)
    assert follower.runner.graphs.lora_replays == leader.runner.graphs.lora_replays > 0
    assert torch.equal(leader.runner.kv_cache, follower.runner.kv_cache)


@pytest.mark.skipif(DEVICE == "cuda" and torch.cuda.device_count() < 2,
                    reason="TP=2 on CUDA needs two GPUs")
def test_tp2_through_the_buckets_matches_tp1(case, bucketed):
    engine = _engine(case, max_loras=3, tensor_parallel_size=2)
    try:
        assert _run(engine, case) == bucketed[2]
        assert engine.runner.graphs.lora_replays > 0
    finally:
        engine.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("slots", [3, 1], ids=["resident", "one-slot"])
def test_captured_lora_graphs_token_exact_against_eager(case, slots):
    outputs = []
    for eager in (True, False):
        engine = _engine(case, max_loras=slots, max_cpu_loras=slots, enforce_eager=eager,
                         dtype="bfloat16")
        assert engine.runner.graphs.captured is not eager
        outputs.append(_run(engine, case))
        assert engine.runner.graphs.lora_replays > 0
        del engine
    assert outputs[0] == outputs[1]
