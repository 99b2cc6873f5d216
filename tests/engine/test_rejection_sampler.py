"""The rejection sampler leaves the target's distribution unchanged (chi-square over many draws on
a small vocabulary), and the same test catches a sampler that does not."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from baton.services.engine.speculation.rejection import rejection_sample, verify_greedy

VOCAB, K, TRIALS = 6, 2, 12000


def biased_sample(target_probs, draft, draft_probs, generator):
    """A plausible bug: a rejected token is redrawn from p itself rather than from max(0, p - q)."""
    out = []
    for j, token in enumerate(draft):
        q = 1.0 if draft_probs is None else float(draft_probs[j, token])
        if float(torch.rand(1, generator=generator, dtype=torch.float64)) * q <= float(
                target_probs[j, token]):
            out.append(token)
            continue
        out.append(int(torch.multinomial(target_probs[j], 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(target_probs[len(draft)], 1, generator=generator)))
    return out


def distributions(seed: int):
    """Target p for K + 1 positions and draft q for K, random on the simplex; and the generator
    that every draw of the trials then comes from (the test is deterministic)."""
    g = torch.Generator().manual_seed(seed)
    points = -torch.rand(2 * K + 1, VOCAB, generator=g, dtype=torch.float64).log()
    probs = points / points.sum(dim=1, keepdim=True)  # uniform on the simplex (Dirichlet(1))
    return probs[:K + 1], probs[K + 1:], g


def emitted_counts(sampler, target, draft_probs, generator, fixed_draft=None):
    """Counts of the first emitted token, and of the second where the first was accepted."""
    first, second = torch.zeros(VOCAB), torch.zeros(VOCAB)
    for _ in range(TRIALS):
        if fixed_draft is None:
            draft = [int(torch.multinomial(draft_probs[j], 1, generator=generator))
                     for j in range(K)]
        else:
            draft = fixed_draft
        out = sampler(target, draft, None if fixed_draft else draft_probs, generator)
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
    return first, second


def p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(chisquare(counts.numpy(), expected.numpy()).pvalue)


@pytest.mark.parametrize("deterministic_draft", [False, True], ids=["draft-model", "ngram"])
def test_rejection_sampling_keeps_the_target_distribution(deterministic_draft):
    target, draft_probs, g = distributions(seed=11)
    fixed = [int(draft_probs[j].argmax()) for j in range(K)] if deterministic_draft else None
    first, second = emitted_counts(rejection_sample, target, draft_probs, g, fixed)
    assert p_value(first, target[0]) > 1e-3
    # Where the first draft token was accepted, the next emitted token is again distributed as p_1.
    assert second.sum() > 500 and p_value(second, target[1]) > 1e-3


@pytest.mark.parametrize("deterministic_draft", [False, True], ids=["draft-model", "ngram"])
def test_a_biased_sampler_fails_the_same_test(deterministic_draft):
    target, draft_probs, g = distributions(seed=11)
    fixed = [int(draft_probs[j].argmax()) for j in range(K)] if deterministic_draft else None
    first, _ = emitted_counts(biased_sample, target, draft_probs, g, fixed)
    assert p_value(first, target[0]) < 1e-6


def test_greedy_verification_takes_the_agreeing_prefix_and_one_more():
    assert verify_greedy([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]
    assert verify_greedy([5, 9, 7, 8], [5, 6, 7]) == [5, 9]
    assert verify_greedy([4, 6, 7, 8], [5, 6, 7]) == [4]
