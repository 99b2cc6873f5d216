"""The batch's token masks: filled by the grammar engine once per step, applied to the logits by the
sampler.

llguidance fills one packed bitmask row per constrained sequence (32 tokens per int32). The engine
asks for them right after launching the forward pass: on a GPU the kernels are still running while
the CPU fills the masks, so the work is hidden without any thread. The sampler then turns the bits
into -inf on the disallowed logits in a few tensor ops, for the whole batch at once. Measured
alternatives were slower on CPU (see docs/benchmarks.md): a helper thread paid for GIL hand-offs
every step, and llguidance's parallel executor's spinning workers fought torch's threads for the
cores.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from baton.services.engine.sequence import Sequence


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, words] int32 bitmask -> [rows, vocab_size] bool, True where the token is allowed."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


class BatchMasks:
    """The masks of a step's constrained sequences, rows keyed by request id."""

    def __init__(self, bitmask: torch.Tensor, rows: dict[str, int]) -> None:
        self.bitmask, self.rows = bitmask, rows

    def apply(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Sets the logits of every token the grammar forbids to -inf (logits rows follow seqs)."""
        targets = [i for i, s in enumerate(seqs) if s.request_id in self.rows]
        if not targets:
            return
        sources = torch.tensor([self.rows[seqs[i].request_id] for i in targets])
        allowed = unpack(self.bitmask[sources].to(logits.device, non_blocking=True),
                         logits.shape[1])
        index = torch.tensor(targets, device=logits.device)
        # In place on the runner's inference-mode logits: `sample`, the only caller, runs in
        # inference mode.
        logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


class MaskBuilder:
    def __init__(self, vocab_size: int) -> None:
        self.words = (vocab_size + 31) // 32

    def fill(self, seqs: list[Sequence]) -> BatchMasks | None:
        """The masks of the constrained sequences among seqs; None when none is constrained."""
        constrained = [s for s in seqs if s.grammar is not None]
        if not constrained:
            return None
        bitmask = torch.empty((len(constrained), self.words), dtype=torch.int32)
        # Straight into the rows' memory: llguidance's per-row helper re-checks the tensor on every
        # call.
        base, row_bytes = bitmask.data_ptr(), self.words * 4
        for row, seq in enumerate(constrained):
            seq.grammar.matcher.unsafe_compute_mask_ptr(base + row * row_bytes, row_bytes)
        return BatchMasks(bitmask, {s.request_id: i for i, s in enumerate(constrained)})
