"""Speculative verify steps through their graph buckets (verify_graphs.py). On CPU the buckets run
as enforce_eager runs them on CUDA (the same buffers, without a graph; Triton attention in
interpreter mode): greedy outputs with drafts (an oracle n-gram proposer's and a draft model's)
equal those without speculation, token for token, through verify buckets that pad short drafts and
missing items; a sampled target-as-draft still accepts everything; dummy rows write no KV and
change no real row; a follower replays every verify bucket rank 0 names. On a GPU the captured
verify graphs are checked against enforce_eager."""
from __future__ import annotations

import json

import pytest
import torch

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.parallel.step_sync import MirrorItem, MirrorSeq, StepEncoder
from baton.services.engine.verify_graphs import VerifyBatch, verify_batch
from tests.engine.draft_helpers import perturbed_copy
from tests.engine.eagle_helpers import agreeing_head, bigram_target, make_head
from tests.engine.eagle_reference import EagleReference
from tests.engine.engine_helpers import random_prompts
from tests.engine.lora_helpers import make_adapters
from tests.engine.test_speculation import OracleProposer
from tests.engine.test_speculation_draft import DraftRecorder
from tests.engine.tp_graph_helpers import StepMirror, spy_runs

# Triton runs CPU tensors only in interpreter mode, which a CUDA machine's test run does not use.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
K = 3
NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1,
                    "prompt_lookup_max": 3})
ENGINE = dict(dtype="float32", device=DEVICE, attention_backend="triton", num_kv_blocks=64,
              block_size=4, max_model_len=128, max_num_batched_tokens=64,
              cuda_graph_max_batch_size=16, num_threads=1, enforce_eager=True)
# The last request stops early: later steps run two items in bucket 2.
PARAMS = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (12, 12, 7)]


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(3, 250, seed=3, min_len=5, max_len=20)


def _engine(model, spec: str | None, **kwargs) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model), speculative_config=spec,
                                  **{**ENGINE, **kwargs}))


@pytest.fixture(scope="module")
def plain(tiny_model_dirs, prompts):
    return [o.token_ids for o in _engine(tiny_model_dirs["llama"], None).generate(prompts,
                                                                                 PARAMS)]


@pytest.fixture(scope="module")
def oracle(tiny_model_dirs, prompts, plain):
    """An engine whose drafts are the reference continuation, wrong in turn at their first or
    second token, mirrored by a follower runner; its outputs and the verify runs seen."""
    model = tiny_model_dirs["llama"]
    engine, follower = _engine(model, NGRAM), _engine(model, NGRAM).runner
    engine.speculator.proposer = OracleProposer([p + o for p, o in zip(prompts, plain)])
    mirror = engine.runner.executor = StepMirror(follower)
    engine.runner.encoder = StepEncoder()
    seen, follower_seen = spy_runs(engine.runner.verify_graphs), spy_runs(follower.verify_graphs)
    out = [o.token_ids for o in engine.generate(prompts, PARAMS)]
    return engine, follower, mirror, seen, follower_seen, out


def test_greedy_oracle_drafts_through_verify_buckets_equal_no_speculation(oracle, plain):
    engine, _, _, seen, _, out = oracle
    assert out == plain
    assert engine.speculator.stats.num_accepted_tokens > 0
    graphs = engine.runner.verify_graphs
    # As many token rows as the largest decode bucket: 16 // (1 + K) items.
    assert graphs.buckets == [1, 2, 4] and graphs.width == 1 + K
    assert graphs.replays == len(seen) > 0
    # Short drafts (cut by max_tokens, or none at all) were padded, and so were missing items.
    assert any(len(tokens) < 1 + K for batch, _ in seen for tokens in batch.token_ids)
    assert any(len(batch.token_ids) < graphs.bucket_for(len(batch.token_ids))
               for batch, _ in seen)
    assert engine.runner.graphs.replays > 0  # decode steps kept their own buckets
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def test_a_follower_replays_every_verify_bucket_rank0_names(oracle):
    engine, follower, mirror, seen, follower_seen, _ = oracle
    named = [m.bucket for m in mirror.messages
             if m.bucket is not None and any(s.draft for s in m.seqs)]
    assert named and [b for _, b in seen] == [b for _, b in follower_seen] == named
    assert follower.verify_graphs.replays == engine.runner.verify_graphs.replays
    assert torch.equal(engine.runner.kv_cache, follower.kv_cache)


def _item(tokens: int = 1, draft: tuple[int, ...] = (), lora: int | None = None,
          computed: int = 20, blocks: tuple[int, ...] = (0, 1, 2, 3, 4, 5)) -> MirrorItem:
    seq = MirrorSeq(computed, [7] * (computed + tokens), list(blocks), False, lora)
    return MirrorItem(seq, tokens, True, list(draft))


def test_the_verify_bucket_decision(oracle):
    runner = oracle[0].runner
    full, short = _item(draft=(3, 4, 5)), _item(draft=(3,))
    assert [runner._decode_bucket([full] * n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, None]
    assert runner._decode_bucket([short, _item()]) == 2  # padded rows, an item without a draft
    assert runner._decode_bucket([_item(draft=(1, 2, 3, 4))]) is None  # longer than k
    assert runner._decode_bucket([full, _item(tokens=5)]) is None  # a prefill chunk
    assert runner._decode_bucket([full, _item(lora=0)]) is None  # LoRA is off
    runner.model.capture_layers = (0, 1)  # an EAGLE-3 head reads layer inputs
    try:
        assert runner._decode_bucket([full]) is None
    finally:
        runner.model.capture_layers = ()


def _changed_slots(before: torch.Tensor, after: torch.Tensor, block_size: int) -> set[int]:
    # [layers, blocks, 2, block_size, heads, dim] in either layout: compare per (block, offset).
    diff = (before != after).movedim(3, 2).flatten(4).any(dim=(0, 3, 4))
    return {int(b) * block_size + int(o) for b, o in diff.nonzero().tolist()}


def test_dummy_rows_write_nothing_and_change_no_real_row(oracle):
    runner = oracle[0].runner
    graphs, bs = runner.verify_graphs, runner.block_size
    # Its draft one short of k: positions 21-23 are real (block 45), the chunk's last row a dummy
    # at position 24, past the item's blocks.
    item = _item(draft=(11, 12), computed=21, blocks=(40, 41, 42, 43, 44, 45))
    other = _item(draft=(13, 14, 15), computed=9, blocks=(50, 51, 52, 53))
    before = runner.kv_cache.clone()
    alone = graphs.run(verify_batch([item]), 1)[:3].clone()
    assert _changed_slots(before, runner.kv_cache, bs) == {45 * bs + p % bs for p in (21, 22, 23)}
    padded = graphs.run(verify_batch([item, other]), 4)
    assert torch.allclose(padded[:3], alone, atol=1e-5)
    # The eager chunked-prefill path's rows for the same chunk.
    ids, positions, meta, _ = runner._prepare([item])
    assert torch.allclose(runner.model(ids, positions, meta), alone, atol=1e-5)


@pytest.fixture(scope="module")
def draft_model(tiny_model_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("verify-draft")
    return perturbed_copy(tiny_model_dirs["llama"], root / "llama", 0.03)


def _draft_config(model) -> str:
    return json.dumps({"method": "draft_model", "model": str(model), "num_speculative_tokens": K})


def test_greedy_with_a_draft_model_through_verify_buckets(tiny_model_dirs, draft_model, prompts,
                                                          plain):
    engine = _engine(tiny_model_dirs["llama"], _draft_config(draft_model))
    assert [o.token_ids for o in engine.generate(prompts, PARAMS)] == plain
    assert engine.speculator.stats.num_accepted_tokens > 0
    assert engine.runner.verify_graphs.replays > 0
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def test_sampled_target_as_its_own_draft_accepts_everything(tiny_model_dirs, prompts):
    # Drawn from the target's own distributions, min(1, p/q) is 1: weighed by the verify
    # buckets' logits, every draft token is kept unless those logits differ from the draft's.
    model = tiny_model_dirs["llama"]
    engine = _engine(model, _draft_config(model))
    params = SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True)
    got = engine.generate(prompts[:2], params)
    assert all(len(o.token_ids) == 8 for o in got)
    assert engine.speculator.stats.acceptance_rate >= 0.95
    assert engine.runner.verify_graphs.replays > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_captured_verify_graphs_token_exact_against_eager(tiny_model_dirs, prompts, dtype):
    model = tiny_model_dirs["llama"]
    # The oracle's references in this dtype, so that its drafts are accepted in part.
    refs = [p + o.token_ids for p, o in zip(prompts, _engine(model, None, dtype=dtype).generate(
        prompts, PARAMS))]
    outputs = []
    for eager in (True, False):
        engine = _engine(model, NGRAM, dtype=dtype, enforce_eager=eager)
        engine.speculator.proposer = OracleProposer(refs)
        assert engine.runner.verify_graphs.captured is not eager
        assert engine.runner.verify_graphs.buckets == [1, 2, 4]
        outputs.append([o.token_ids for o in engine.generate(prompts, PARAMS)])
        assert engine.runner.verify_graphs.replays > 0
        assert engine.speculator.stats.num_accepted_tokens > 0
    assert outputs[0] == outputs[1]


@pytest.mark.skipif(DEVICE == "cuda" and torch.cuda.device_count() < 2,
                    reason="TP=2 on CUDA needs two GPUs")
def test_tp2_through_the_verify_buckets_matches_tp1(tiny_model_dirs, prompts, plain):
    engine = _engine(tiny_model_dirs["llama"], NGRAM, tensor_parallel_size=2)
    try:
        # Two requests, a few tokens: the interpreter runs every rank's kernels on two cores.
        engine.speculator.proposer = OracleProposer([p + o for p, o in zip(prompts, plain)])
        got = engine.generate(prompts[1:], PARAMS[1:])
        assert [o.token_ids for o in got] == plain[1:]
        assert engine.runner.verify_graphs.replays > 0
        assert engine.speculator.stats.num_accepted_tokens > 0
    finally:
        engine.close()


def test_an_eagle_head_reads_the_graphs_hidden_states(tiny_model_dirs, tmp_path_factory,
                                                      prompts):
    """EAGLE-1 reads the final hidden states, the graphs' own output: its target's decode and
    verify steps take their buckets, its own chained passes the head's, and greedy outputs stay
    those without speculation."""
    root = tmp_path_factory.mktemp("verify-eagle")
    target = bigram_target(tiny_model_dirs["llama"], root / "target")
    head = agreeing_head(target, root / "head", False, noise=0.002)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    want = [o.token_ids for o in _engine(target, None).generate(prompts, params)]
    spec = json.dumps({"method": "eagle", "model": str(head), "num_speculative_tokens": K})
    engine = _engine(target, spec)
    recorder = engine.speculator.proposer = DraftRecorder(engine.speculator.proposer)
    assert [o.token_ids for o in engine.generate(prompts, params)] == want
    assert engine.speculator.stats.num_accepted_tokens > 0
    # The drafts are the head's own from scratch: it was handed the right rows.
    full = [(ctx, d) for ctx, d in recorder.drafts if len(d) == K]
    reference = EagleReference(target, head, False)
    assert len(full) > 3
    assert [d for _, d in full[::2]] == [reference.drafts(ctx, K) for ctx, _ in full[::2]]
    assert engine.runner.verify_graphs.replays > 0 and engine.runner.graphs.replays > 0
    assert recorder.proposer.runner.head_graphs.replays > 0  # its chained passes
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


def _lora_run(engine: LLMEngine, prompts, names) -> list[list[int]]:
    for i, (prompt, name) in enumerate(zip(prompts, names)):
        engine.add_request(str(i), prompt, PARAMS[i], lora_name=name)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    return [done[str(i)] for i in range(len(prompts))]


def test_lora_verify_steps_take_the_buckets_lora_variant(tiny_model_dirs, tmp_path_factory,
                                                         prompts):
    model = tiny_model_dirs["llama"]
    adapters = make_adapters(model, tmp_path_factory.mktemp("verify-adapters"))
    modules = [f"{name}={path}" for name, path in adapters.items()]
    names = [None, *list(adapters)[:2]]
    want = _lora_run(_engine(model, None, lora_modules=modules), prompts, names)
    engine = _engine(model, NGRAM, lora_modules=modules)
    engine.speculator.proposer = OracleProposer([p + o for p, o in zip(prompts, want)])
    assert _lora_run(engine, prompts, names) == want
    assert engine.speculator.stats.num_accepted_tokens > 0
    assert engine.runner.verify_graphs.lora_replays > 0


def test_an_eagle3_heads_chained_passes_take_its_buckets(tiny_model_dirs, tmp_path_factory,
                                                         prompts):
    """EAGLE-3 reads layer inputs, which the target's graphs do not keep: its target's steps run
    eagerly, its own chained passes through the head's buckets still draft what a float64
    reference does."""
    target = tiny_model_dirs["qwen2"]
    head = make_head(target, tmp_path_factory.mktemp("verify-eagle3") / "head", True)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    spec = json.dumps({"method": "eagle3", "model": str(head), "num_speculative_tokens": K})
    engine = _engine(target, spec)
    recorder = engine.speculator.proposer = DraftRecorder(engine.speculator.proposer)
    want = [o.token_ids for o in _engine(target, None).generate(prompts, params)]
    assert [o.token_ids for o in engine.generate(prompts, params)] == want
    assert engine.runner.verify_graphs.replays == engine.runner.graphs.replays == 0
    assert recorder.proposer.runner.head_graphs.replays > 0
    full = [(ctx, d) for ctx, d in recorder.drafts if len(d) == K]
    reference = EagleReference(target, head, True)
    assert len(full) > 3
    assert [d for _, d in full[::3]] == [reference.drafts(ctx, K) for ctx, _ in full[::3]]
