"""Decode graphs under tensor parallelism, on CPU: every rank captures the same buckets (the time
limit agreed bucket by bucket, between a TP=2 engine's ranks), followers replay exactly the bucket
rank 0 names in its step message (an in-process follower mirroring rank 0's steps, and the
decision's cases one by one), and greedy outputs at TP=2 through the bucketed decode path (run
eagerly, as enforce_eager runs it on CUDA, with the Triton attention in interpreter mode) are
TP=1's token for token. On two GPUs the captured graphs at TP=2 are checked against
enforce_eager."""
from __future__ import annotations

import pytest
import torch

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.cuda_graphs import DecodeBatch, bucket_sizes, capture_in_lockstep
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.parallel.state import solo
from baton.services.engine.parallel.step_sync import MirrorItem, MirrorSeq, StepEncoder
from tests.engine.engine_helpers import random_prompts
from tests.engine.tp_graph_helpers import (TIME_LIMIT_S, CaptureTask, StepMirror, capture,
                                          slow_clock, spy_runs)

# Triton runs CPU tensors only in interpreter mode, which a CUDA machine's test run does not use:
# there the same tests run on the GPU, the buckets eager as on CPU.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ENGINE = dict(dtype="float32", device=DEVICE, attention_backend="triton", num_kv_blocks=64,
              max_model_len=256, max_num_batched_tokens=32, cuda_graph_max_batch_size=4,
              num_threads=1, enforce_eager=True)
TP2 = pytest.mark.skipif(DEVICE == "cuda" and torch.cuda.device_count() < 2,
                         reason="TP=2 on CUDA needs two GPUs")
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def prompts():
    # Three at once: the decode steps of all three replay bucket 4, one padding row.
    return random_prompts(3, 250, seed=3, min_len=5, max_len=30)


def _generate(engine: LLMEngine, prompts) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [out.token_ids for out in engine.generate(prompts, params)]


@pytest.fixture(scope="module")
def mirrored(tiny_model_dirs, prompts):
    """Rank 0's runner (a TP=1 engine) whose steps a follower runner mirrors; its outputs."""
    config = EngineConfig(model=str(tiny_model_dirs["llama"]), **ENGINE)
    leader, follower = LLMEngine(config), LLMEngine(config).runner
    mirror = leader.runner.executor = StepMirror(follower)
    leader.runner.encoder = StepEncoder()
    leader_runs, follower_runs = spy_runs(leader.runner.graphs), spy_runs(follower.graphs)
    out = _generate(leader, prompts)
    return leader.runner, follower, mirror, leader_runs, follower_runs, out


def test_followers_replay_the_bucket_rank0_names(mirrored):
    leader, follower, mirror, leader_runs, follower_runs, _ = mirrored
    assert leader.graphs.buckets == follower.graphs.buckets == [1, 2, 4]
    named = [m.bucket for m in mirror.messages if m.bucket is not None]
    assert named and [b for _, b in leader_runs] == [b for _, b in follower_runs] == named
    padded = [m for m in mirror.messages if m.bucket is not None and m.bucket > len(m.seqs)]
    assert padded, "no decode step was padded"
    # Steps with prefill tokens ran eagerly on both.
    assert any(m.bucket is None for m in mirror.messages)
    assert torch.equal(leader.kv_cache, follower.kv_cache)


def _item(tokens: int = 1, draft: tuple[int, ...] = (), lora: int | None = None,
          prompt_logprobs: bool = False) -> MirrorItem:
    # The decision reads the items' shapes and flags only, never their tokens.
    seq = MirrorSeq(20, [7] * (20 + tokens), [0, 1], prompt_logprobs, lora)
    return MirrorItem(seq, tokens, True, list(draft))


def test_the_bucket_decision(mirrored):
    leader = mirrored[0]
    assert [leader._decode_bucket([_item()] * n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, None]
    assert leader._decode_bucket([_item(), _item(tokens=5)]) is None  # a prefill chunk
    assert leader._decode_bucket([_item(), _item(draft=(3, 4))]) is None  # a verify pass
    assert leader._decode_bucket([_item(), _item(lora=0)]) is None
    assert leader._decode_bucket([_item(), _item(prompt_logprobs=True)]) is None
    leader.model.capture_layers = (0, 1)  # an EAGLE-3 head reads layer inputs
    try:
        assert leader._decode_bucket([_item()]) is None
    finally:
        leader.model.capture_layers = ()


def test_a_follower_refuses_a_bucket_it_does_not_hold(mirrored):
    follower = mirrored[1]
    batch = DecodeBatch([7], [3], [3], [[0]], [4])
    with pytest.raises(RuntimeError, match="decode bucket 3 cannot run 1 rows"):
        follower.graphs.run(batch, 3)
    with pytest.raises(RuntimeError, match="decode bucket 1 cannot run 2 rows"):
        follower.graphs.run(DecodeBatch([7, 8], [3, 3], [3, 19], [[0], [1]], [4, 4]), 1)


@pytest.fixture(scope="module")
def tp2(tiny_model_dirs, prompts):
    """A TP=2 engine after generating the prompts, its outputs and the step messages it sent."""
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dirs["llama"]),
                                    tensor_parallel_size=2, **ENGINE))
    try:
        executor, sent = engine.runner.executor, []
        send = executor.send
        executor.send = lambda message: (sent.append(message), send(message))
        yield engine, _generate(engine, prompts), sent
    finally:
        engine.close()


@TP2
def test_tp2_through_the_bucketed_decode_path_matches_tp1(tp2, mirrored):
    engine, out, sent = tp2
    assert out == mirrored[-1]
    assert engine.runner.graphs.replays > 0
    assert any(m.bucket is not None and m.bucket > len(m.seqs) for m in sent)


@TP2
def test_every_rank_stops_capturing_at_the_same_bucket(tp2):
    executor = tp2[0].runner.executor
    # Rank 1 passes the limit after two buckets; rank 0 alone would capture all seven.
    task = executor.post(CaptureTask(step_s=10.0))
    ours = capture(step_s=0.0, device=tp2[0].runner.device)
    [theirs] = executor.wait(task, timeout_s=60)
    assert ours == tuple(theirs) == ([32, 40], [2.0, 2.0])


def test_capture_stops_at_the_time_limit_alone():
    # This process is rank 0 of the TP=2 engine above while it lives: a group of one here.
    with solo():
        steps = capture_in_lockstep([40, 32, 16, 8], lambda b: b, TIME_LIMIT_S, slow_clock(10.0))
        everything = capture_in_lockstep(list(reversed(bucket_sizes(8))), lambda b: b, 1.0,
                                         slow_clock(0.0))
    assert sorted(steps) == [32, 40] and sorted(everything) == [1, 2, 4, 8]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="TP=2 over NCCL needs two GPUs")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tp2_cuda_graphs_token_exact_against_eager(tiny_model_dirs, prompts, dtype):
    base = dict(model=str(tiny_model_dirs["llama"]), device="cuda", dtype=dtype,
                num_kv_blocks=128, max_num_batched_tokens=32, cuda_graph_max_batch_size=4,
                tensor_parallel_size=2)
    outputs = []
    for eager in (True, False):
        engine = LLMEngine(EngineConfig(**base, enforce_eager=eager))
        try:
            assert engine.runner.graphs.captured is not eager
            assert engine.runner.graphs.buckets == [1, 2, 4]
            outputs.append(_generate(engine, prompts))
            assert engine.runner.graphs.replays > 0
        finally:
            engine.close()
    assert outputs[0] == outputs[1]
