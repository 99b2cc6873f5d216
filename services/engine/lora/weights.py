"""The device side of LoRA: for every adapted projection, A and B of each slot stacked
([slots, max_rank, in] and [slots, out, max_rank], zero-padded to the largest rank), and the step's
slot per token. A projection adds its delta with one gathered product per part
(kernels/lora_bgmv.py on CUDA, its torch reference elsewhere), never a loop over adapters.

Under tensor parallelism the stacks hold this rank's slices (the layer's lora_shard): B's output
rows of a column-parallel part, A's input columns of a row-parallel layer, whose partial delta
joins the layer's one all-reduce."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch
from torch import nn

from baton.kernels.reference import lora_bgmv_ref
from baton.services.engine.lora.adapter import AdapterWeights

if TYPE_CHECKING:
    from baton.services.engine.lora.replicas import LoRAReplicas

_MODULE = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)$")


class LoRAState:
    """What every adapted projection shares: the slots' scales and this step's slot per token
    (None when no token of the step has an adapter, so the base model pays nothing)."""

    def __init__(self, slots: int, device: torch.device) -> None:
        self.scales = torch.zeros(slots, dtype=torch.float32, device=device)
        self.indices: torch.Tensor | None = None
        self.layers: dict[tuple[int, str], LayerLoRA] = {}
        # Rank 0 under tensor parallelism: what tells the other ranks to fill their slots alike.
        self.replicas: LoRAReplicas | None = None


class LayerLoRA:
    """The slot stacks of one projection; a stacked projection (qkv, gate/up) has one per part,
    each adding into its own columns of the output."""

    def __init__(self, state: LoRAState, in_features: int, parts: list[tuple[str, slice, int]],
                 shards: dict[str, tuple[slice, slice]], max_rank: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        """parts: (projection, its columns of the output, their number); shards: per projection,
        the adapter's A columns and B rows this rank holds."""
        self.state = state
        self.parts = parts
        self.shards = shards
        slots = state.scales.shape[0]
        self.a = {p: torch.zeros(slots, max_rank, in_features, dtype=dtype, device=device)
                  for p, _, _ in parts}
        self.b = {p: torch.zeros(slots, size, max_rank, dtype=dtype, device=device)
                  for p, _, size in parts}

    def add_delta(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """y += each token's adapter delta, in place."""
        indices = self.state.indices
        if indices is None:
            return
        if x.is_cuda:
            from baton.kernels.lora_bgmv import lora_bgmv as bgmv
        else:
            bgmv = lora_bgmv_ref
        for proj, cols, _ in self.parts:
            bgmv(y[:, cols], x, self.a[proj], self.b[proj], self.state.scales, indices)

    def write(self, slot: int, proj: str, pair: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """Puts an adapter's A and B for `proj` into `slot` (zeros where it does not adapt it)."""
        a, b = self.a[proj][slot], self.b[proj][slot]
        a.zero_()
        b.zero_()
        if pair is not None:
            rank = pair[0].shape[0]
            a_cols, b_rows = self.shards[proj]
            a[:rank].copy_(pair[0][:, a_cols])
            b[:, :rank].copy_(pair[1][b_rows])


def attach(model: nn.Module, slots: int, max_rank: int, dtype: torch.dtype,
           device: torch.device) -> LoRAState:
    """Gives every decoder projection of `model` its slot stacks (the layer's `lora`)."""
    state = LoRAState(slots, device)
    parts_of: dict[str, list[str]] = {}
    for proj, (stacked, part) in getattr(model, "stacked_projections", {}).items():
        parts_of.setdefault(stacked, []).insert(part, proj)
    for name, module in model.named_modules():
        match = _MODULE.search(name)
        if match is None or not hasattr(module, "lora"):
            continue
        layer, stacked = int(match.group(1)), match.group(2)
        projs = parts_of.get(stacked, [stacked])
        sizes = getattr(module, "part_sizes", [module.weight.shape[0]])
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        parts = [(p, slice(s, s + n), n) for p, s, n in zip(projs, starts, sizes)]
        shards = {p: module.lora_shard(i) for i, p in enumerate(projs)}
        module.lora = LayerLoRA(state, module.weight.shape[1], parts, shards, max_rank, dtype,
                                device)
        for proj in projs:
            state.layers[(layer, proj)] = module.lora
    return state


@torch.no_grad()
def write_slot(state: LoRAState, slot: int, adapter: AdapterWeights) -> None:
    """Loads an adapter into a device slot, over whatever the slot held."""
    for (layer, proj), lora in state.layers.items():
        lora.write(slot, proj, adapter.weights.get((layer, proj)))
    state.scales[slot] = adapter.scaling
