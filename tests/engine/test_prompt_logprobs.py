"""Prompt logprobs and logit_bias in the engine, against transformers on the same checkpoint
(float32, CPU)."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from baton.loadtest.sim.runner import SimulatedRunner
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from tests.engine.engine_helpers import random_prompts

ATOL = 1e-4


def reference_prompt_logprobs(model_dir, prompt: list[int]) -> torch.Tensor:
    """log_softmax of transformers' logits: row p scores prompt token p + 1."""
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0].float().log_softmax(dim=-1)


def check_against(reference: torch.Tensor, prompt: list[int], got: list, k: int) -> None:
    assert len(got) == len(prompt) and got[0] is None
    for p, entry in enumerate(got[1:]):
        row = reference[p]
        assert entry.token_id == prompt[p + 1]
        assert entry.logprob == pytest.approx(float(row[prompt[p + 1]]), abs=ATOL)
        assert entry.rank == int((row > row[prompt[p + 1]]).sum()) + 1
        best = row.topk(k)
        assert list(entry.top) == best.indices.tolist()
        assert list(entry.top.values()) == pytest.approx(best.values.tolist(), abs=ATOL)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.mark.parametrize("chunk", [None, 16])
def test_prompt_logprobs_match_transformers(model_dir, chunk):
    """Whole prompt in one step, and chunked prefill (16-token chunks) with a prefix already in the
    cache: the cached blocks are recomputed, so every position is scored either way."""
    prompt = random_prompts(1, 500, seed=7, min_len=70, max_len=70)[0]
    kwargs = {"max_num_batched_tokens": chunk} if chunk else {}
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", block_size=16, **kwargs))
    engine.generate([prompt], SamplingParams(max_tokens=1))  # fills the prefix cache
    out = engine.generate([prompt], SamplingParams(max_tokens=2, prompt_logprobs=3,
                                                   temperature=0))[0]
    check_against(reference_prompt_logprobs(model_dir, prompt), prompt, out.prompt_logprobs, 3)
    assert out.num_cached_tokens == 0


def test_logit_bias_forces_and_bans(model_dir):
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32"))
    prompt = random_prompts(1, 500, seed=3, min_len=8, max_len=8)[0]
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    plain = engine.generate([prompt], greedy)[0].token_ids
    forced = engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True,
                                                      logit_bias={7: 100.0}))[0].token_ids
    assert plain != [7] * 4 and forced == [7] * 4
    banned = engine.generate([prompt],
                             SamplingParams(max_tokens=4, temperature=0, ignore_eos=True,
                                            logit_bias={t: -100.0
                                                        for t in set(plain)}))[0].token_ids
    assert not set(banned) & set(plain)


@pytest.mark.parametrize("bias, message", [({600: 1.0}, "in \\[0, 512\\)"),
                                           ({3: 101.0}, "biases in"), ({-1: 1.0}, "non-negative")])
def test_bad_logit_bias_is_refused(model_dir, bias, message):
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32"))
    with pytest.raises(ValueError, match=message):
        engine.add_request("r", [1, 2, 3], SamplingParams(logit_bias=bias))


def test_prompt_logprobs_survive_preemption(model_dir):
    """24 blocks of 16 tokens hold only a few of these at once, and prompts run in 32-token chunks:
    sequences are preempted and recomputed (positions already scored are skipped); every prompt is
    still scored correctly."""
    prompts = random_prompts(6, 500, seed=11, min_len=60, max_len=60)
    engine = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", num_kv_blocks=24,
                                    max_num_batched_tokens=32))
    outs = engine.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True, temperature=0,
                                                   prompt_logprobs=1))
    assert engine.scheduler.stats.preemptions > 0
    for prompt, out in zip(prompts, outs):
        check_against(reference_prompt_logprobs(model_dir, prompt), prompt, out.prompt_logprobs, 1)


def test_the_simulated_engine_refuses_prompt_logprobs():
    engine = LLMEngine(EngineConfig(engine="sim"), sim_runner=SimulatedRunner)
    with pytest.raises(ValueError, match="prompt_logprobs needs the model engine"):
        engine.add_request("r", [1, 2, 3], SamplingParams(prompt_logprobs=1))
