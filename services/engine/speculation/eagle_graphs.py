"""CUDA graphs for an EAGLE head's chained passes.

After its first pass (over the accepted positions, eager), the head drafts k - 1 more tokens, one
single-position pass each over the whole batch: a layer's worth of kernels, where launches dominate.
Those passes replay one graph per batch bucket (cuda_graphs.py's machinery, decode buffers and
all), reading two more persistent buffers: each row's token embedding and the hidden state it
pairs with (the head's own from the previous position). The embedding lookup stays outside the
graph, since under tensor parallelism it reads rank 0's host copy (eagle_vocab.py), and so do the
logits. The head runs on rank 0 alone, so its captures agree with no other rank (solo()).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from baton.services.engine.config import EngineConfig
from baton.services.engine.cuda_graphs import DecodeGraphs, DecodeInputs
from baton.services.engine.parallel.state import solo

if TYPE_CHECKING:
    from baton.services.engine.speculation.eagle_head import EagleHead


class HeadInputs(DecodeInputs):
    """The decode buffers, and each row's embedding and paired hidden state."""

    def __init__(self, max_batch: int, max_blocks_per_seq: int, width: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__(max_batch, max_blocks_per_seq, device)
        self.embeds = torch.zeros((max_batch, width), dtype=dtype, device=device)
        self.hidden = torch.zeros((max_batch, width), dtype=dtype, device=device)


class HeadGraphs(DecodeGraphs):
    """The head's buckets; hidden_size: that of the hidden states a chained pass pairs with."""
    kind = "EAGLE head"
    hidden_size = 0


def head_graphs(head: EagleHead, engine: EngineConfig, max_batch: int, max_model_len: int,
                dtype: torch.dtype, device: torch.device) -> HeadGraphs | None:
    """The chained passes' buckets: captured on CUDA, run eagerly on the same buffers with
    enforce_eager or on CPU; None without the Triton attention (the buffers' metadata is its)."""
    if head.layer.self_attn.attention.backend != "triton":
        return None
    inputs = HeadInputs(max_batch, -(-max_model_len // engine.block_size),
                        head.config.hidden_size, dtype, device)

    def forward(ids: torch.Tensor, positions: torch.Tensor, meta) -> torch.Tensor:
        rows = ids.shape[0]
        out, nxt = head(inputs.embeds[:rows], inputs.hidden[:rows], positions, meta)
        # One output buffer: EAGLE-1's two results are one tensor, EAGLE-3's side by side.
        return out if out is nxt else torch.cat((out, nxt), dim=-1)

    graphs = HeadGraphs(forward, max_batch, 0, device, inputs=inputs)
    graphs.hidden_size = head.config.hidden_size
    if engine.enforce_eager or device.type != "cuda":
        graphs.use_eager()
    else:
        with solo():
            graphs.capture()
    return graphs
