from __future__ import annotations

import pytest
import torch

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.sampler import sample
from baton.services.engine.sequence import Sequence

EOS = frozenset({0})


def seqs(*params: SamplingParams, prompt=(1, 2, 3)) -> list[Sequence]:
    return [Sequence(f"r{i}", list(prompt), p) for i, p in enumerate(params)]


def logits(rows: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_and_degenerate_filters_pick_the_argmax():
    x = logits(4)
    batch = seqs(SamplingParams(temperature=0), SamplingParams(top_k=1), SamplingParams(top_p=1e-6),
                 SamplingParams(min_p=1.0))
    tokens, _ = sample(x.clone(), batch, torch.Generator().manual_seed(0), EOS)
    assert tokens == x.argmax(1).tolist()


def test_seeded_rows_reproduce_whatever_shares_the_batch():
    p = SamplingParams(temperature=1.0, seed=1234)
    alone = [
        sample(logits(1, seed=9), seqs(p),
               torch.Generator().manual_seed(0), EOS)[0][0] for _ in range(1)
    ]
    mixed_logits = torch.cat([logits(3, seed=5), logits(1, seed=9)])
    batch = seqs(SamplingParams(temperature=1.0), SamplingParams(temperature=0.5), SamplingParams(),
                 p)
    tokens, _ = sample(mixed_logits, batch, torch.Generator().manual_seed(99), EOS)
    assert tokens[3] == alone[0]
    # The same seed over a sequence of steps gives the same sequence of draws.
    def run() -> list[int]:
        s = seqs(SamplingParams(temperature=1.0, seed=7))
        return [sample(logits(1, seed=k), s, torch.Generator(), EOS)[0][0] for k in range(20)]
    assert run() == run()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_seeded_and_unseeded_rows_sample_on_gpu_logits_as_on_cpu():
    # A seeded request's generator is a CPU one; on GPU logits its noise must still come from it,
    # unchanged.
    batch = [SamplingParams(temperature=1.0, seed=s)
             for s in range(8)] + [SamplingParams(temperature=0.8)]
    x = logits(9, vocab=32000)
    on_cpu, _ = sample(x.clone(), seqs(*batch), torch.Generator().manual_seed(0), EOS)
    on_gpu, _ = sample(x.cuda(), seqs(*batch), torch.Generator(device="cuda").manual_seed(0), EOS)
    assert on_gpu[:8] == on_cpu[:8]


def test_temperature_sampling_follows_the_softmax():
    x = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    expected = (x / 0.7).softmax(1)[0]
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(4000):
        counts[sample(x.clone(), seqs(SamplingParams(temperature=0.7)), gen, EOS)[0][0]] += 1
    assert torch.allclose(counts / 4000, expected, atol=0.03)


def test_top_k_top_p_min_p_restrict_the_support():
    x = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    cases = [(SamplingParams(top_k=2), {0, 1}),
             # p = .64, .24, .09...: .64 < .8 so the second stays
             (SamplingParams(top_p=0.8), {0, 1}),
             # .24/.64 >= .3 keeps token 1; .09/.64 does not keep 2
             (SamplingParams(min_p=0.3), {0, 1})]
    for params, support in cases:
        drawn = {sample(x.clone(), seqs(params), gen, EOS)[0][0] for _ in range(300)}
        assert drawn == support, params


def test_penalties():
    x = torch.zeros(1, 10)
    x[0, 5] = 2.0
    x[0, 6] = 1.9
    rep = seqs(SamplingParams(temperature=0, repetition_penalty=1.5), prompt=(5,))
    assert sample(x.clone(), rep, torch.Generator(), EOS)[0] == [6]
    freq = seqs(SamplingParams(temperature=0, frequency_penalty=0.05), prompt=(1,))
    freq[0].token_ids += [5, 5, 5]  # output tokens: 5 three times -> 2.0 - 0.15 < 1.9
    assert sample(x.clone(), freq, torch.Generator(), EOS)[0] == [6]
    pres = seqs(SamplingParams(temperature=0, presence_penalty=0.2), prompt=(1,))
    pres[0].token_ids += [5]
    assert sample(x.clone(), pres, torch.Generator(), EOS)[0] == [6]
    # Penalties on prompt tokens apply only to repetition, as in vLLM.
    prompt_only = seqs(SamplingParams(temperature=0, frequency_penalty=2.0), prompt=(5,))
    assert sample(x.clone(), prompt_only, torch.Generator(), EOS)[0] == [5]


def test_min_tokens_blocks_eos_and_stop_ids():
    x = torch.zeros(1, 10)
    x[0, 0] = 5.0  # eos
    x[0, 3] = 4.0  # a stop token id
    s = seqs(SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[3]))
    assert sample(x.clone(), s, torch.Generator(), EOS)[0] not in ([0], [3])


def test_logprobs_are_the_raw_distribution():
    x = logits(2)
    batch = seqs(SamplingParams(temperature=0, logprobs=3, repetition_penalty=1.3),
                 SamplingParams(temperature=0))
    tokens, lps = sample(x.clone(), batch, torch.Generator(), EOS)
    raw = x.log_softmax(1)[0]
    lp = lps[0]
    assert lps[1] is None
    assert abs(lp.logprob - float(raw[lp.token_id])) < 1e-6
    assert list(lp.top) == raw.topk(3).indices.tolist()
    assert lp.rank == int((raw > raw[lp.token_id]).sum()) + 1
