"""The n-gram proposer (prompt lookup): drafts the tokens that followed the last earlier occurrence
of the sequence's own suffix.

For n from prompt_lookup_max down to prompt_lookup_min, the last n tokens are looked for earlier in
prompt + output; the first n with a match wins, and the tokens after its latest occurrence that
still has k tokens after it are the draft (the earliest when none has). Latest, because a copy of
the prompt continues where it last matched and a generation that repeats itself repeats its most
recent cycle; with k tokens after it, so that a short cycle still fills the draft.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from baton.services.engine.speculation.proposer import SequenceProposer


class NgramProposer(SequenceProposer):

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to k draft tokens to follow token_ids; empty when no suffix recurs."""
        total = len(token_ids)
        if k <= 0 or total <= self.min_n:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            # Windows starting before the suffix itself; each must be followed by a token.
            windows = sliding_window_view(tokens[:total - 1], n)
            hits = np.flatnonzero((windows == tokens[total - n:]).all(axis=1))
            if hits.size:
                full = hits[hits + n + k <= total]
                start = int(full[-1] if full.size else hits[0]) + n
                return token_ids[start:start + k]
        return []
