"""The token embedding and the lm_head: both a [vocab, hidden] table, which tensor parallelism
splits by vocabulary rows (each rank looks up or scores its own range of token ids).

Vocab-parallel rather than a replicated lm_head: a replicated table costs every rank
vocab x hidden weights twice over (embedding and head: 2 GiB each for a 128K-token vocabulary at
hidden 8192 in bf16), where the split costs one all-reduce of the embeddings per step and one
gather of the sampled rows' logits to rank 0 (docs/benchmarks.md, `baton bench tp`, measures
these among the collectives). Tied embeddings share the one split table.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from baton.services.engine.layers.weights import Loadable, copy_checked, copy_shard
from baton.services.engine.parallel.sharding import vocab_range
from baton.services.engine.parallel.state import get_tp_group


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.tp = get_tp_group()
        self.vocab_size = vocab_size
        self.start, self.end, rows = vocab_range(vocab_size, self.tp.rank, self.tp.size)
        self.weight = nn.Parameter(torch.empty(rows, hidden_size))

    def weight_loader(self, param: nn.Parameter, loaded: Loadable, name: str,
                      part: int | None = None) -> int:
        if self.tp.size == 1:
            return copy_checked(param, loaded, name)
        own = self.end - self.start
        with torch.no_grad():
            # The last rank's padding rows: zeros, whose logits are cut before sampling.
            param[own:].zero_()
        copy_shard(param[:own], loaded, name, (self.vocab_size, param.shape[1]),
                   slice(self.start, self.end))
        return param.shape[0]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.start) & (input_ids < self.end)
        local = torch.where(mine, input_ids - self.start, 0)
        out = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Scores hidden states against every token's row; with tied word embeddings the model makes
    its weight the embedding's. Under tensor parallelism each rank scores its vocabulary range and
    rank 0, which samples, gathers them; the other ranks get None."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = F.linear(hidden, self.weight)
        if self.tp.size == 1:
            return logits
        gathered = self.tp.gather_last_dim(logits)
        return None if gathered is None else gathered[..., :self.vocab_size]
