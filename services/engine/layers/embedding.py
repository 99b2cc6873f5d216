"""The token embedding and the lm_head: both a [vocab, hidden] table, which tensor parallelism
splits by vocabulary rows (each rank looks up or scores its own range of token ids)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from baton.services.engine.layers.weights import Loadable, copy_checked


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size))

    def weight_loader(self, param: nn.Parameter, loaded: Loadable, name: str,
                      part: int | None = None) -> int:
        return copy_checked(param, loaded, name)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class ParallelLMHead(VocabParallelEmbedding):
    """Scores hidden states against every token's row; with tied word embeddings the model makes
    its weight the embedding's."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)
