"""What a proposer is to the speculator: given the step and the sequences that may take a draft
(each with the most tokens it may take), a draft for each.

A draft's probs are the distributions its tokens were drawn from, which the rejection sampler
needs to keep a sampled request's output distribution; a proposer that drafts deterministically
(n-gram, a greedy draft model) gives none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from baton.services.engine.scheduler import ScheduledSeq


@dataclass
class Draft:
    tokens: list[int]
    # [len(tokens), vocab] float64 on the host: row j is what tokens[j] was drawn from
    probs: torch.Tensor | None = None


class Proposer(Protocol):

    def draft(self, step: list[ScheduledSeq],
              wanted: list[tuple[ScheduledSeq, int]]) -> list[Draft]:
        """wanted: (decode item, most tokens its draft may have), in the step's order; returns
        their drafts in that order. step: every item of the step, for a proposer with a KV cache
        of its own to keep up with their prefill chunks."""


class SequenceProposer:
    """A proposer that drafts each sequence alone from its tokens (n-gram, and test oracles)."""

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k draft tokens to follow token_ids."""
        raise NotImplementedError

    def draft(self, step: list[ScheduledSeq],
              wanted: list[tuple[ScheduledSeq, int]]) -> list[Draft]:
        return [Draft(self.propose(item.seq.token_ids, room)) for item, room in wanted]
