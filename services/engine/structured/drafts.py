"""A grammar's view of a speculative draft: the part of it the grammar allows, and the mask at
each position a verify step scores.

Verification must choose every token as plain decoding would, so row j of a drafted sequence's
logits is masked by the grammar's state after draft[:j]. The matcher is walked through the draft
to compute those masks and rolled back to where it stood: the output processor advances it only by
the tokens verification accepts.
"""
from __future__ import annotations

import torch

from baton.services.engine.structured.masks import unpack
from baton.services.engine.structured.matcher import GrammarState


def allowed_prefix(grammar: GrammarState, draft: list[int]) -> list[int]:
    """The longest prefix of draft that the grammar accepts from its current state (a token it
    refuses could never be verified, nor anything after it)."""
    return draft[:grammar.matcher.validate_tokens(draft)]


def draft_masks(grammar: GrammarState, draft: list[int], vocab_size: int) -> torch.Tensor:
    """[len(draft) + 1, vocab_size] bool, row j True where a token may follow draft[:j]. The draft
    must be an allowed_prefix: every token of it is consumed on the way."""
    words = (vocab_size + 31) // 32
    bitmask = torch.empty((len(draft) + 1, words), dtype=torch.int32)
    base, row_bytes = bitmask.data_ptr(), words * 4
    matcher = grammar.matcher
    consumed = 0
    try:
        for j in range(len(draft) + 1):
            matcher.unsafe_compute_mask_ptr(base + j * row_bytes, row_bytes)
            if j < len(draft):
                if not matcher.consume_token(draft[j]):
                    raise ValueError(f"draft token {j} ({draft[j]}) breaks the grammar")
                consumed += 1
    finally:
        matcher.rollback(consumed)
    return unpack(bitmask, vocab_size)
