"""Projections, y = x W^T + b in nn.Linear's layout and arithmetic, each loading its own weight.

Every projection a model builds is one of these, named for how tensor parallelism splits it
(Megatron: column-parallel layers by output rows, row-parallel ones by input columns followed by
one all-reduce). Until that is built every rank holds whole weights, so the classes differ only in
how checkpoint tensors stack into them. LinearBase.forward is the one place a shard's all-reduce or
an adapter's low-rank delta (services/engine/lora/) is added, and weight_loader the one place a
rank picks its slice.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from baton.services.engine.layers.weights import Loadable, copy_checked

if TYPE_CHECKING:
    from baton.services.engine.lora.weights import LayerLoRA


class LinearBase(nn.Module):
    """A [out_features, in_features] weight and an optional [out_features] bias."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.register_parameter("bias", nn.Parameter(torch.empty(out_features)) if bias else None)
        # Set by services/engine/lora/weights.py:attach when the engine serves LoRA adapters.
        self.lora: LayerLoRA | None = None

    def rows(self, part: int | None) -> slice:
        """The rows of weight and bias that a checkpoint tensor for `part` fills."""
        return slice(None)

    def weight_loader(self, param: nn.Parameter, loaded: Loadable, name: str,
                      part: int | None = None) -> int:
        """Copies checkpoint tensor `name` into param's rows for `part`; a tensor of another
        shape is refused by name."""
        return copy_checked(param[self.rows(part)], loaded, name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.lora is not None:
            # The base GEMM is shared by the whole batch; each token adds its adapter's delta.
            self.lora.add_delta(x, y)
        return y


class RowParallelLinear(LinearBase):
    """A projection whose output joins the residual stream (o_proj, down_proj). Under tensor
    parallelism each rank holds a slice of the input columns, matching the column-parallel
    layer before it, and the partial outputs are summed by an all-reduce."""


class MergedColumnParallelLinear(LinearBase):
    """Checkpoint projections of the same input stacked by output rows, part 0 first (gate_proj
    and up_proj): one GEMM reads the activations once and launches once, where at decode's few
    rows each small GEMM would run well below bandwidth. Under tensor parallelism each part is
    split by its rows, so a rank's output still holds every part."""

    def __init__(self, in_features: int, part_sizes: list[int], bias: bool) -> None:
        super().__init__(in_features, sum(part_sizes), bias)
        self.part_sizes = part_sizes

    def rows(self, part: int | None) -> slice:
        # None: a checkpoint that stores the projection already stacked.
        if part is None:
            return slice(None)
        start = sum(self.part_sizes[:part])
        return slice(start, start + self.part_sizes[part])


class QKVParallelLinear(MergedColumnParallelLinear):
    """q_proj, k_proj and v_proj as parts 0, 1 and 2, sized by heads: tensor parallelism splits
    them by heads (KV heads replicated where there are fewer than ranks)."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool) -> None:
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        super().__init__(hidden_size, [q_size, kv_size, kv_size], bias)
