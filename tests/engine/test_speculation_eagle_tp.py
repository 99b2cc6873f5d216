"""EAGLE and EAGLE-3 heads at tensor parallelism 2 on CPU (gloo), run whole on rank 0: greedy
outputs are TP=1's without speculation token for token, with drafts accepted in part (so the head's
KV is rolled back), each of a share of the drafts the head's own greedy continuation (a float64
reference from scratch), on targets whose KV heads split (2 over 2 ranks) and are replicated (1);
rank 0's whole copies of the target's embedding and lm_head are the target's own tables; a head
refused after the ranks started stops them."""
from __future__ import annotations

import json

import psutil
import pytest
import torch
from safetensors.torch import load_file, save_file

from baton.services.checkpoints.tiny_model import TinyModelSpec, make_tiny_model
from baton.services.common.model_config import load_config
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.parallel.state import get_tp_group
from baton.services.engine.speculation.config import SpeculativeConfigError
from baton.services.engine.speculation.eagle_vocab import lm_head_bytes, shared_vocab, whole_vocab
from baton.services.engine.speculation.footprint import draft_footprint
from tests.engine.eagle_helpers import WEIGHTS, agreeing_head, bigram_target, make_head
from tests.engine.eagle_reference import EagleReference
from tests.engine.engine_helpers import random_prompts
from tests.engine.test_speculation_draft import DraftRecorder, assert_all_blocks_free

K = 3
ENGINE = dict(dtype="float32", device="cpu", max_model_len=256, num_threads=1, block_size=4,
              num_kv_blocks=256)
GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=2)
# Noise on the agreeing heads' weights under which a part of the drafts is accepted.
NOISE = {"eagle": 0.002, "eagle3": 0.005}


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    # Even last tokens: the agreeing EAGLE-3 head's draft vocabulary has the even tokens.
    return [p[:-1] + [p[-1] // 2 * 2]
            for p in random_prompts(3, vocab_size=500, seed=5, min_len=8, max_len=30)]


@pytest.fixture(scope="module")
def targets(tiny_model_dirs, tmp_path_factory) -> dict[str, tuple]:
    """(target, noisy agreeing head) per method: EAGLE-1 on the tiny Llama, whose 2 KV heads
    split over 2 ranks; EAGLE-3 on a Llama of 1 KV head, which both ranks replicate."""
    root = tmp_path_factory.mktemp("eagle-tp")
    one_kv = make_tiny_model(root / "llama-1kv", TinyModelSpec.preset("llama", num_kv_heads=1))
    out = {}
    for method, src, repeat in (("eagle", tiny_model_dirs["llama"], False),
                                ("eagle3", one_kv, True)):
        target = bigram_target(src, root / f"target-{method}", repeat=repeat)
        out[method] = (target, agreeing_head(target, root / f"head-{method}", method == "eagle3",
                                             NOISE[method]))
    return out


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_tp2_with_a_head_equals_tp1_without(targets, prompts, method):
    target, head = targets[method]
    plain = LLMEngine(EngineConfig(model=str(target), **ENGINE))
    want = plain.generate(prompts, GREEDY)
    spec = json.dumps({"method": method, "model": str(head), "num_speculative_tokens": K})
    engine = LLMEngine(EngineConfig(model=str(target), speculative_config=spec,
                                    tensor_parallel_size=2, **ENGINE))
    try:
        recorder = engine.speculator.proposer = DraftRecorder(engine.speculator.proposer)
        got = engine.generate(prompts, GREEDY)
        assert_all_blocks_free(engine)
        # The head is whole on rank 0: every KV head of its own; the target's are split or not.
        runner = engine.speculator.proposer.proposer.runner
        head_kv = json.loads((head / "config.json").read_text())["num_key_value_heads"]
        assert runner.kv_cache.shape[4] == head_kv
        assert engine.runner.kv_cache.shape[4] == max(
            1, engine.model_config.num_key_value_heads // 2)
    finally:
        engine.close()
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for a, b in zip(got, want):
        assert [lp.logprob for lp in a.logprobs] == pytest.approx(
            [lp.logprob for lp in b.logprobs], abs=1e-4)
    stats = engine.speculator.stats
    assert stats.accepted_per_pos[-1] > 0 and 0 < stats.acceptance_rate < 1
    full = [(ctx, d) for ctx, d in recorder.drafts if len(d) == K]
    assert len(full) > 4
    reference = EagleReference(target, head, method == "eagle3")
    assert [d for _, d in full[::3]] == [reference.drafts(ctx, K) for ctx, _ in full[::3]]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_rank0_tables_are_the_targets(tiny_model_dirs, arch):
    """Untied (llama) and tied (qwen2) embeddings: the tables rank 0 reads itself look up and
    score as the target's own layers do."""
    model_dir = tiny_model_dirs[arch]
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", device="cpu",
                                    num_kv_blocks=8))
    model, cpu = engine.runner.model, torch.device("cpu")
    own, whole = shared_vocab(model), whole_vocab(model_dir, model.config, False, torch.float32,
                                                  cpu)
    ids = torch.tensor([0, 7, 300, model.config.vocab_size - 1])
    assert torch.equal(whole.embed(ids), own.embed(ids))
    hidden = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(whole.logits(hidden), own.logits(hidden), atol=1e-5)
    assert whole_vocab(model_dir, model.config, True, torch.float32, cpu).logits is None


def test_an_eagle1_footprint_at_tp_counts_rank0s_lm_head(tiny_model_dirs, tmp_path):
    target = tiny_model_dirs["llama"]
    config = load_config(target)
    head = make_head(target, tmp_path / "head", False)
    spec = json.dumps({"method": "eagle", "model": str(head), "num_speculative_tokens": 2})
    alone = draft_footprint(spec, config, 4, torch.float32)
    at_tp2 = draft_footprint(spec, config, 4, torch.float32, 2)
    assert at_tp2.weight_bytes - alone.weight_bytes == lm_head_bytes(config, torch.float32)
    assert at_tp2.block_bytes == alone.block_bytes
    spec3 = spec.replace('"eagle"', '"eagle3"')
    head3 = make_head(target, tmp_path / "head3", True)
    spec3 = spec3.replace(str(head), str(head3))
    # An EAGLE-3 head scores with its own lm_head.
    assert draft_footprint(spec3, config, 4, torch.float32, 2) == draft_footprint(
        spec3, config, 4, torch.float32)


def test_a_head_refused_at_tp2_stops_the_other_rank(tiny_model_dirs, tmp_path):
    """The head loads after the ranks are up: refusing it stops them and leaves this process out
    of the group, so that an engine built next starts afresh."""
    target = tiny_model_dirs["llama"]
    head = make_head(target, tmp_path / "head", False)
    weights = load_file(head / WEIGHTS)
    del weights["fc.weight"]
    save_file(weights, head / WEIGHTS)
    spec = json.dumps({"method": "eagle", "model": str(head), "num_speculative_tokens": 2})
    # Children other tests left behind (servers being torn down) are not this engine's ranks.
    before = {p.pid for p in psutil.Process().children()}
    with pytest.raises(SpeculativeConfigError, match="lacks tensors for: .*fc.weight"):
        LLMEngine(EngineConfig(model=str(target), speculative_config=spec,
                               tensor_parallel_size=2, **ENGINE))
    assert get_tp_group().size == 1
    assert not [p for p in psutil.Process().children() if p.pid not in before]
