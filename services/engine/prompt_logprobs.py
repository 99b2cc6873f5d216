"""Prompt logprobs (vLLM's `prompt_logprobs`, OpenAI's `echo` with `logprobs`): the logprob of every
prompt token given its prefix, computed from the hidden states a prefill step already produces.

A request that asks for them must have every prompt position run through the model, so the scheduler
gives it no prefix-cache hits (as vLLM does): recomputing a cached prefix is simple and always
correct, while keeping logits next to cached blocks would cost memory for every cached prompt to
serve the few requests that ask.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from baton.services.common.outputs import TokenLogprobs
from baton.services.engine.scheduler import ScheduledSeq

# Rows of logits materialised at once: a long chunk times a large vocabulary would not fit
# otherwise.
ROWS_PER_SLICE = 256


def _pending_positions(item: ScheduledSeq) -> range:
    """Positions of this step whose next token is a prompt token not yet scored. Position p predicts
    p + 1; a recompute after preemption skips what an earlier pass already recorded."""
    seq, first = item.seq, item.seq.num_computed_tokens
    start = max(first, len(seq.prompt_logprobs) - 1)
    end = min(first + item.num_tokens, seq.num_prompt_tokens - 1)
    return range(start, max(start, end))


def _score(logprobs: torch.Tensor, targets: torch.Tensor, k: int) -> list[TokenLogprobs]:
    chosen = logprobs.gather(1, targets.unsqueeze(1))
    ranks = (logprobs > chosen).sum(dim=1) + 1
    top = logprobs.topk(k, dim=1) if k > 0 else None
    result = []
    for i, (token, value,
            rank) in enumerate(zip(targets.tolist(),
                                   chosen.squeeze(1).tolist(), ranks.tolist())):
        best = {} if top is None else dict(zip(top.indices[i].tolist(), top.values[i].tolist()))
        result.append(TokenLogprobs(token_id=token, logprob=value, rank=rank, top=best))
    return result


def scoring_plan(packed: list[ScheduledSeq]) -> list[tuple[int, int, int, int]]:
    """Each lm_head call prompt scoring makes this step: (item index, first position, end position,
    first hidden row). packed: the step's items in the order their tokens sit in hidden."""
    plan, offset = [], 0
    for i, item in enumerate(packed):
        seq = item.seq
        if seq.prompt_logprobs is not None:
            positions = _pending_positions(item)
            first = seq.num_computed_tokens
            for start in range(positions.start, positions.stop, ROWS_PER_SLICE):
                stop = min(start + ROWS_PER_SLICE, positions.stop)
                plan.append((i, start, stop, offset + start - first))
        offset += item.num_positions
    return plan


def score_prompts(packed: list[ScheduledSeq], hidden: torch.Tensor,
                  compute_logits: Callable[[torch.Tensor], torch.Tensor],
                  plan: list[tuple[int, int, int, int]] | None = None) -> None:
    """Appends to each asking sequence's `prompt_logprobs` the entries this step's hidden states
    give, following `plan` (default: scoring_plan(packed))."""
    for i, start, stop, row in scoring_plan(packed) if plan is None else plan:
        seq = packed[i].seq
        logprobs = compute_logits(hidden[row:row + stop - start]).log_softmax(dim=1)
        targets = torch.tensor(seq.token_ids[start + 1:stop + 1], device=logprobs.device)
        seq.prompt_logprobs += _score(logprobs, targets, seq.params.prompt_logprobs)
