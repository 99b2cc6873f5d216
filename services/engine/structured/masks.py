"""The batch's token masks: filled by the grammar engine while the forward pass runs, applied to the logits.

llguidance fills one packed bitmask row per constrained sequence (32 tokens per int32) on its own native
threads, without the GIL; running that fill on a helper thread started before the forward pass hides it behind
the model's work. The sampler then turns the bits into -inf on the disallowed logits in a few tensor ops.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch
from llguidance import LLExecutor
from llguidance.torch import fill_next_token_bitmask_par

if TYPE_CHECKING:
    from baton.services.engine.sequence import Sequence


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, words] int32 bitmask -> [rows, vocab_size] bool, True where the token is allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


class PendingMasks:
    """Masks being computed for some of a step's sequences, keyed by request id."""

    def __init__(self, future: Future, bitmask: torch.Tensor, rows: dict[str, int]) -> None:
        self.future, self.bitmask, self.rows = future, bitmask, rows

    def apply(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Sets the logits of every token the grammar forbids to -inf (logits rows follow seqs)."""
        self.future.result()
        targets = [i for i, s in enumerate(seqs) if s.request_id in self.rows]
        if not targets:
            return
        sources = torch.tensor([self.rows[seqs[i].request_id] for i in targets])
        allowed = unpack(self.bitmask[sources].to(logits.device, non_blocking=True), logits.shape[1])
        index = torch.tensor(targets, device=logits.device)
        with torch.inference_mode():  # the model runner's logits are inference tensors
            logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


class MaskBuilder:
    def __init__(self, vocab_size: int, num_threads: int | None = None) -> None:
        self.words = (vocab_size + 31) // 32
        self.executor = LLExecutor(num_threads)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-masks")

    def start(self, seqs: list[Sequence]) -> PendingMasks | None:
        """Begins filling the masks of the constrained sequences among seqs; None when none is constrained."""
        constrained = [s for s in seqs if s.grammar is not None]
        if not constrained:
            return None
        bitmask = torch.empty((len(constrained), self.words), dtype=torch.int32)
        pairs = [(s.grammar.matcher, i) for i, s in enumerate(constrained)]
        future = self.pool.submit(fill_next_token_bitmask_par, self.executor, pairs, bitmask)
        return PendingMasks(future, bitmask, {s.request_id: i for i, s in enumerate(constrained)})

    def close(self) -> None:
        self.pool.shutdown(wait=True)
