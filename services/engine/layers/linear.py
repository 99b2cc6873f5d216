"""Projections, y = x W^T + b in nn.Linear's layout and arithmetic, each loading its own weight.

Every projection a model builds is one of these, named for how tensor parallelism splits it
(Megatron: column-parallel layers by output rows, row-parallel ones by input columns followed by
one all-reduce). The split is the process's tensor-parallel group's (parallel/state.py), read when
the layer is built: each layer allocates only its rank's rows or columns and its weight_loader
reads only that slice of each checkpoint tensor. At TP=1 every layer is the whole projection and
runs nn.Linear's arithmetic unchanged. LinearBase.forward is where an adapter's low-rank delta
(services/engine/lora/) is added; under tensor parallelism each layer's lora_shard names the
slices of an adapter's A and B its rank holds, split as the layer's weight is (vLLM's scheme).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from baton.services.engine.layers.weights import Loadable, copy_checked, copy_shard, shape_of
from baton.services.engine.parallel.sharding import HeadSplit, even_range
from baton.services.engine.parallel.state import get_tp_group

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

    def lora_shard(self, part: int) -> tuple[slice, slice]:
        """(A's input columns, B's output rows) of an adapter for checkpoint part `part` that
        this rank holds: all of both when the layer is whole."""
        return slice(None), slice(None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if self.lora is not None:
            # The base GEMM is shared by the whole batch; each token adds its adapter's delta.
            self.lora.add_delta(x, y)
        return y


class RowParallelLinear(LinearBase):
    """A projection whose output joins the residual stream (o_proj, down_proj). Under tensor
    parallelism each rank holds a slice of the input columns, matching the column-parallel
    layer before it, and the partial outputs are summed by an all-reduce; the bias, replicated,
    is added once after it."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        self.tp = get_tp_group()
        self.full_in = in_features
        super().__init__(in_features // self.tp.size, out_features, bias)

    def weight_loader(self, param: nn.Parameter, loaded: Loadable, name: str,
                      part: int | None = None) -> int:
        if self.tp.size == 1 or param.dim() == 1:
            return copy_checked(param, loaded, name)
        cols = even_range(self.full_in, self.tp.rank, self.tp.size)
        return copy_shard(param, loaded, name, (param.shape[0], self.full_in), (slice(None), cols))

    def lora_shard(self, part: int) -> tuple[slice, slice]:
        # A split by input columns like the weight, B whole: each rank's B (A_r x_r) is a partial
        # delta that the layer's one all-reduce sums with the partial outputs.
        return even_range(self.full_in, self.tp.rank, self.tp.size), slice(None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(x)
        partial = F.linear(x, self.weight)
        if self.lora is not None:
            self.lora.add_delta(x, partial)
        out = self.tp.all_reduce(partial)
        return out if self.bias is None else out + self.bias


class MergedColumnParallelLinear(LinearBase):
    """Checkpoint projections of the same input stacked by output rows, part 0 first (gate_proj
    and up_proj): one GEMM reads the activations once and launches once, where at decode's few
    rows each small GEMM would run well below bandwidth. Under tensor parallelism each part is
    split by its rows, so a rank's output still holds every part."""

    def __init__(self, in_features: int, part_sizes: list[int], bias: bool,
                 local_sizes: list[int] | None = None) -> None:
        """part_sizes: each part's rows in the checkpoint; local_sizes: this rank's (default: an
        even split)."""
        self.tp = get_tp_group()
        self.full_sizes = part_sizes
        self.part_sizes = local_sizes or [n // self.tp.size for n in part_sizes]
        super().__init__(in_features, sum(self.part_sizes), bias)

    def rows(self, part: int | None) -> slice:
        # None: a checkpoint that stores the projection already stacked.
        if part is None:
            return slice(None)
        start = sum(self.part_sizes[:part])
        return slice(start, start + self.part_sizes[part])

    def part_slice(self, part: int) -> slice:
        """This rank's rows of checkpoint part `part`."""
        return even_range(self.full_sizes[part], self.tp.rank, self.tp.size)

    def lora_shard(self, part: int) -> tuple[slice, slice]:
        # A whole (every rank sees the whole input), B split by output rows like the part's.
        return slice(None), self.part_slice(part)

    def weight_loader(self, param: nn.Parameter, loaded: Loadable, name: str,
                      part: int | None = None) -> int:
        if self.tp.size == 1:
            return copy_checked(param[self.rows(part)], loaded, name)
        tail = tuple(param.shape[1:])
        if part is not None:
            full = (self.full_sizes[part], *tail)
            return copy_shard(param[self.rows(part)], loaded, name, full, self.part_slice(part))
        # A stacked checkpoint tensor: this rank's slice of each part, read part by part.
        full = (sum(self.full_sizes), *tail)
        if shape_of(loaded) != full:
            return copy_shard(param, loaded, name, full, slice(None))
        offset = 0
        for i, size in enumerate(self.full_sizes):
            own = self.part_slice(i)
            index = slice(offset + own.start, offset + own.stop)
            copy_shard(param[self.rows(i)], loaded, name, full, index)
            offset += size
        return param.shape[0]


class QKVParallelLinear(MergedColumnParallelLinear):
    """q_proj, k_proj and v_proj as parts 0, 1 and 2, sized by heads: tensor parallelism splits
    them by heads (KV heads replicated where there are fewer than ranks)."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool) -> None:
        tp = get_tp_group()
        self.split = HeadSplit.of(num_heads, num_kv_heads, tp.rank, tp.size)
        self.head_dim = head_dim
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        local_q, local_kv = self.split.num_heads * head_dim, self.split.num_kv_heads * head_dim
        super().__init__(hidden_size, [q_size, kv_size, kv_size], bias,
                         [local_q, local_kv, local_kv])

    def part_slice(self, part: int) -> slice:
        first = self.split.q_start if part == 0 else self.split.kv_start
        start = first * self.head_dim
        return slice(start, start + self.part_sizes[part])
