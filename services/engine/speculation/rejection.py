"""Verification of a draft against the target's distributions (Leviathan et al. 2023, Chen et al.
2023).

Draft token x_j, proposed with probability q_j(x_j), is accepted with probability
min(1, p_j(x_j) / q_j(x_j)); the first rejected one is replaced by a draw from the residual
max(0, p_j - q_j), renormalised, and when every draft token is accepted a bonus token is drawn
from p_{k}. The emitted tokens are then distributed exactly as sampling from p one token at a
time. A proposer that drafts deterministically (n-gram) has q_j one-hot on x_j: acceptance with
probability p_j(x_j), and the residual is p_j without x_j.

Greedy verification is the temperature-zero case: accept while the draft equals the target's
argmax, then emit the argmax where it first differs (or after the last draft token).
"""
from __future__ import annotations

import torch


def verify_greedy(target_argmax: list[int], draft: list[int]) -> list[int]:
    """target_argmax: len(draft) + 1 tokens, the target's choice after each prefix of the draft."""
    out = []
    for j, token in enumerate(draft):
        out.append(target_argmax[j])
        if target_argmax[j] != token:
            return out
    out.append(target_argmax[len(draft)])
    return out


def _draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def rejection_sample(target_probs: torch.Tensor, draft: list[int],
                     draft_probs: torch.Tensor | None, generator: torch.Generator) -> list[int]:
    """target_probs: [len(draft) + 1, vocab] float, CPU; draft_probs: [len(draft), vocab], or None
    for a deterministic proposer. Returns the accepted draft tokens followed by one more token."""
    k = len(draft)
    uniforms = torch.rand(k, generator=generator, dtype=torch.float64).tolist()
    out = []
    for j, token in enumerate(draft):
        p = target_probs[j]
        q_token = 1.0 if draft_probs is None else float(draft_probs[j, token])
        # Accept with probability min(1, p/q), compared without dividing (q may be tiny).
        if uniforms[j] * q_token <= float(p[token]) and float(p[token]) > 0.0:
            out.append(token)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[token] = 0.0
        else:
            residual = (p - draft_probs[j]).clamp_(min=0.0)
        total = float(residual.sum())
        # Float round-off can leave no residual mass where p and q (nearly) agree; p itself is then
        # the distribution to draw from.
        out.append(_draw(residual / total if total > 0.0 else p, generator))
        return out
    out.append(_draw(target_probs[k], generator))
    return out
