"""Turns one step's logits into next tokens: penalties, temperature, top-k/top-p/min-p, seeds,
logprobs.

Rows are handled in groups so that common batches (all greedy, no penalties) cost one argmax. Random
draws use the exponential-race form (argmax of p / E, E ~ Exp(1)), which lets a seeded request draw
from its own generator and reproduce its output whatever else shares the batch.
"""
from __future__ import annotations

import torch

from baton.services.common.outputs import TokenLogprobs
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.sequence import Sequence
from baton.services.engine.structured.masks import BatchMasks


def penalize_row(row: torch.Tensor, params: SamplingParams, token_ids: list[int],
                 output_ids: list[int]) -> None:
    """One row's repetition penalty (over prompt and output) and frequency and presence penalties
    (over the output), in place; token_ids and output_ids are what precede the scored position."""
    if params.repetition_penalty != 1.0:
        seen = torch.zeros(row.shape[0], dtype=torch.bool, device=row.device)
        seen[torch.tensor(token_ids, device=row.device)] = True
        penalized = torch.where(row > 0, row / params.repetition_penalty,
                                row * params.repetition_penalty)
        row.copy_(torch.where(seen, penalized, row))
    if (params.frequency_penalty or params.presence_penalty) and output_ids:
        counts = torch.bincount(torch.tensor(output_ids, device=row.device),
                                minlength=row.shape[0]).to(row.dtype)
        row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(
            row.dtype)


def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    for row, seq in enumerate(seqs):
        if seq.params.has_penalties:
            penalize_row(logits[row], seq.params, seq.token_ids, seq.output_token_ids)


def apply_logit_bias(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """OpenAI's logit_bias: one scatter-add over every (row, token, bias) of the batch."""
    rows, cols, values = [], [], []
    for row, seq in enumerate(seqs):
        bias = seq.params.logit_bias
        if bias:
            rows += [row] * len(bias)
            cols += bias.keys()
            values += bias.values()
    if rows:
        dev = logits.device
        index = (torch.tensor(rows, device=dev), torch.tensor(cols, device=dev))
        logits.index_put_(index, torch.tensor(values, dtype=logits.dtype, device=dev),
                          accumulate=True)


def _block_early_stop(logits: torch.Tensor, seqs: list[Sequence], eos_ids: frozenset[int]) -> None:
    """min_tokens: the stop tokens cannot be drawn until enough tokens exist. A grammar decides
    alone where its output ends: blocking the end it allows could leave no token at all."""
    for row, seq in enumerate(seqs):
        p = seq.params
        if seq.num_output_tokens < p.min_tokens and seq.grammar is None:
            banned = set(p.stop_token_ids) | (set() if p.ignore_eos else eos_ids)
            if banned:
                logits[row, list(banned)] = float("-inf")


def filter_probs(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p, returning probabilities."""
    temps = torch.tensor([s.params.temperature for s in seqs], dtype=logits.dtype,
                         device=logits.device)
    logits = logits / temps.unsqueeze(1)
    top_ks = [s.params.top_k for s in seqs]
    if any(k > 0 for k in top_ks):
        vocab = logits.shape[1]
        k = torch.tensor([min(k, vocab) if k > 0 else vocab for k in top_ks], device=logits.device)
        kth = logits.sort(dim=1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    # Decided on host copies of the parameters, so that no branch waits for the device.
    top_ps = torch.tensor([s.params.top_p for s in seqs], dtype=logits.dtype)
    if bool((top_ps < 1.0).any()):
        top_ps = top_ps.to(logits.device)
        sorted_logits, order = logits.sort(dim=1, descending=True)
        cumulative = sorted_logits.softmax(dim=1).cumsum(dim=1)
        # Drop a token when the mass strictly before it already reaches top_p; the best token always
        # stays.
        drop_sorted = (cumulative - sorted_logits.softmax(dim=1)) >= top_ps.unsqueeze(1)
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=1)
    min_ps = torch.tensor([s.params.min_p for s in seqs], dtype=logits.dtype)
    if bool((min_ps > 0).any()):
        min_ps = min_ps.to(logits.device)
        threshold = probs.max(dim=1, keepdim=True).values * min_ps.unsqueeze(1)
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


def _draw(probs: torch.Tensor, seqs: list[Sequence], generator: torch.Generator) -> torch.Tensor:
    noise = torch.empty_like(probs).exponential_(generator=generator)
    for row, seq in enumerate(seqs):
        if seq.generator is not None:
            # A seeded request's generator is a CPU one: drawing there and copying keeps its stream
            # the same whatever device the logits are on.
            noise[row].copy_(
                torch.empty(probs.shape[1],
                            dtype=probs.dtype).exponential_(generator=seq.generator))
    return (probs / noise).argmax(dim=1)


def skip_draws(seq: Sequence, vocab_size: int, num_tokens: int) -> None:
    """Advances a seeded request's generator past tokens sampled elsewhere (a hand-off or a
    migration), so it draws next what it would have drawn had it stayed on one worker: `_draw`
    spends one row of noise per token."""
    if seq.generator is not None and not seq.params.greedy:
        for _ in range(num_tokens):
            torch.empty(vocab_size).exponential_(generator=seq.generator)


def token_logprobs(raw: torch.Tensor, chosen: torch.Tensor, k: int) -> TokenLogprobs:
    token = int(chosen)
    value = raw[token]
    top = raw.topk(k) if k > 0 else None
    return TokenLogprobs(
        token_id=token, logprob=float(value), rank=int((raw > value).sum()) + 1,
        top={} if top is None else dict(zip(top.indices.tolist(), top.values.tolist())))


# the runner's logits are inference tensors, which only update in place in this mode
@torch.inference_mode()
def sample(logits: torch.Tensor, seqs: list[Sequence], generator: torch.Generator,
           eos_ids: frozenset[int],
           masks: BatchMasks | None = None) -> tuple[list[int], list[TokenLogprobs | None]]:
    """logits: [len(seqs), vocab] float32 (modified in place). Returns token ids and per-row
    logprobs.

    masks: the grammar masks of the constrained rows, applied before temperature and the filters so
    these only ever choose among tokens the grammar allows."""
    want_logprobs = [s.params.logprobs is not None for s in seqs]
    # Logprobs describe the model's own distribution, before penalties and filters (vLLM's default).
    raw = logits.log_softmax(dim=1) if any(want_logprobs) else None
    _apply_penalties(logits, seqs)
    apply_logit_bias(logits, seqs)
    _block_early_stop(logits, seqs, eos_ids)
    if masks is not None:
        masks.apply(logits, seqs)
    chosen = logits.argmax(dim=1)
    random_rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
    if random_rows:
        rows = torch.tensor(random_rows, device=logits.device)
        subset = [seqs[i] for i in random_rows]
        chosen[rows] = _draw(filter_probs(logits[rows], subset), subset, generator)
    tokens = chosen.tolist()
    logprobs = [
        token_logprobs(raw[i], chosen[i], seqs[i].params.logprobs) if want else None
        for i, want in enumerate(want_logprobs)
    ]
    return tokens, logprobs
