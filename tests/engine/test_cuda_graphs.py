"""Decode steps through the graphs' persistent buffers give the same tokens as eager steps.

On CPU the buckets run as enforce_eager runs them on CUDA: the same forward on the same buffers
without a graph (capture needs CUDA); bucket choice, in-place filling, padding rows and the runner's
dispatch are all exercised. On a GPU the real capture and replay are checked token for token against
enforce_eager.
"""
from __future__ import annotations

import pytest
import torch

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.cuda_graphs import (DecodeBatch, DecodeGraphs, DecodeInputs,
                                               bucket_sizes, pick_bucket)
from baton.services.engine.llm_engine import LLMEngine

# Triton runs CPU tensors only in interpreter mode, which a CUDA machine's test run does not use.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PROMPTS = [list(range(10, 10 + n)) for n in (5, 17, 3, 30, 9, 12)]


def test_buckets():
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert bucket_sizes(256)[-3:] == [224, 240, 256] and len(bucket_sizes(256)) == 20
    buckets = bucket_sizes(40)
    assert [pick_bucket(buckets, n)
            for n in (1, 3, 8, 9, 33, 40, 41)] == [1, 4, 8, 16, 40, 40, None]


def test_fill_pads_rows_to_write_and_read_nothing():
    inputs = DecodeInputs(8, 4, torch.device("cpu"))
    inputs.fill(
        DecodeBatch([5, 6, 7, 8], [3, 9, 0, 20], [3, 41, 16, 52], [[0], [1, 2], [1], [0, 2, 3]],
                    [4, 10, 1, 21]), 4)
    inputs.fill(DecodeBatch([7, 9], [4, 10], [4, 42], [[0], [1, 2]], [5, 11]), 4)
    assert inputs.input_ids[:4].tolist() == [7, 9, 0, 0]
    assert inputs.slot_mapping[:4].tolist() == [4, 42, -1, -1]
    assert inputs.context_lens[:4].tolist() == [5, 11, 0, 0]
    assert inputs.block_tables[1, :2].tolist() == [1, 2]
    meta = inputs.metadata(4)
    assert meta.decode_block_tables.shape == (4, 4) and meta.num_prefill_tokens == 0
    assert meta.slot_mapping.data_ptr() == inputs.slot_mapping.data_ptr()
    inputs.fill(DecodeBatch([], [], [], [], []), 8)  # what capture runs on: padding only
    assert inputs.slot_mapping.tolist() == [-1] * 8 and inputs.context_lens.tolist() == [0] * 8


def _generate(engine: LLMEngine) -> list[list[int]]:
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    return [out.token_ids for out in engine.generate(PROMPTS, params)]


def test_decode_through_bucket_buffers_without_graphs_matches_eager(tiny_model_dirs):
    config = EngineConfig(model=str(tiny_model_dirs["llama"]), device=DEVICE,
                          attention_backend="triton", num_kv_blocks=64, max_num_batched_tokens=32)
    reference = LLMEngine(config)
    assert reference.runner.graphs is not None and not reference.runner.graphs.captured
    reference.runner.graphs = None  # every step packed as prefill steps are
    eager = _generate(reference)
    engine = LLMEngine(config)
    runner = engine.runner
    # What enforce_eager does on CUDA (and the Triton interpreter on CPU); capture needs CUDA.
    graphs = DecodeGraphs(runner.model, 4, -(-engine.max_model_len // config.block_size),
                          engine.device)
    graphs.use_eager()
    runner.graphs = graphs
    assert _generate(engine) == eager
    # Six requests against buckets up to 4: the larger decode batches ran eagerly, the smaller ones
    # replayed.
    assert graphs.replays > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_token_exact_against_eager(tiny_model_dirs, dtype):
    base = dict(model=str(tiny_model_dirs["llama"]), device="cuda", dtype=dtype, num_kv_blocks=128,
                max_num_batched_tokens=32, cuda_graph_max_batch_size=4)
    eager_engine = LLMEngine(EngineConfig(**base, enforce_eager=True))
    assert not eager_engine.runner.graphs.captured
    eager = _generate(eager_engine)
    del eager_engine
    engine = LLMEngine(EngineConfig(**base))
    assert engine.runner.graphs.captured and engine.runner.graphs.buckets == [1, 2, 4]
    assert _generate(engine) == eager
    assert engine.runner.graphs.replays > 0
