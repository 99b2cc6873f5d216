"""LoRA's A and B split as the base layers are, in float64: for every rank of a TP group, the
column-parallel parts (q/k/v stacked, gate/up stacked) give that rank's columns of the whole
delta, KV heads replicated when there are fewer than ranks; the row-parallel layers' partial
deltas (o_proj, down_proj) sum over the ranks to the whole delta, as the layer's all-reduce sums
them."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from baton.services.engine.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                                 RowParallelLinear)
from baton.services.engine.lora.adapter import AdapterWeights, projection_shapes
from baton.services.engine.lora.weights import LoRAState, attach, write_slot
from baton.services.engine.models.llama import STACKED_PROJECTIONS
from baton.services.engine.parallel import state as tp_state
from baton.services.engine.parallel.sharding import HeadSplit

HIDDEN, HEAD_DIM, HEADS, INTER, MAX_RANK = 16, 4, 4, 32, 8
TOKENS = 6
STACKED = {"q_proj": 0, "k_proj": 1, "v_proj": 2, "gate_proj": 0, "up_proj": 1}


class _Config:
    def __init__(self, kv_heads: int) -> None:
        self.hidden_size, self.intermediate_size = HIDDEN, INTER
        self.num_attention_heads, self.num_key_value_heads = HEADS, kv_heads
        self.head_dim = HEAD_DIM


class _Model(nn.Module):
    """One decoder layer's projections, named as the engine's models name them."""
    stacked_projections = STACKED_PROJECTIONS

    def __init__(self, kv_heads: int) -> None:
        super().__init__()
        layer = nn.Module()
        layer.self_attn = nn.Module()
        layer.self_attn.qkv_proj = QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, kv_heads, False)
        layer.self_attn.o_proj = RowParallelLinear(HEADS * HEAD_DIM, HIDDEN, False)
        layer.mlp = nn.Module()
        layer.mlp.gate_up_proj = MergedColumnParallelLinear(HIDDEN, [INTER, INTER], False)
        layer.mlp.down_proj = RowParallelLinear(INTER, HIDDEN, False)
        self.layers = nn.ModuleList([layer])


def _adapters(kv_heads: int) -> list[AdapterWeights]:
    """Two adapters of different ranks over every projection of layer 0."""
    gen = torch.Generator().manual_seed(kv_heads)
    shapes = projection_shapes(_Config(kv_heads))
    out = []
    for name, rank, scaling in (("r3", 3, 0.5), ("r8", 8, 2.0)):
        weights = {(0, p): (torch.randn(rank, fan_in, generator=gen, dtype=torch.float64),
                            torch.randn(fan_out, rank, generator=gen, dtype=torch.float64))
                   for p, (fan_in, fan_out) in shapes.items()}
        out.append(AdapterWeights(name, rank, scaling, weights))
    return out


def _rank_state(kv_heads: int, rank: int, size: int, adapters: list[AdapterWeights],
                monkeypatch: pytest.MonkeyPatch) -> LoRAState:
    """A rank's slot stacks, built as that rank builds them (its layers read the group)."""
    monkeypatch.setattr(tp_state, "_GROUP", tp_state.TPGroup(rank, size))
    state = attach(_Model(kv_heads), len(adapters), MAX_RANK, torch.float64, torch.device("cpu"))
    for slot, adapter in enumerate(adapters):
        write_slot(state, slot, adapter)
    return state


def _whole_delta(adapter: AdapterWeights, proj: str, x: torch.Tensor) -> torch.Tensor:
    a, b = adapter.weights[(0, proj)]
    return adapter.scaling * (x @ a.T) @ b.T


def _column_rows(proj: str, kv_heads: int, rank: int, size: int) -> slice:
    """The rows of the whole projection this rank's part holds."""
    if proj in ("gate_proj", "up_proj"):
        per = INTER // size
        return slice(rank * per, (rank + 1) * per)
    split = HeadSplit.of(HEADS, kv_heads, rank, size)
    first, count = ((split.q_start, split.num_heads) if proj == "q_proj"
                    else (split.kv_start, split.num_kv_heads))
    return slice(first * HEAD_DIM, (first + count) * HEAD_DIM)


@pytest.mark.parametrize("kv_heads,size", [(2, 1), (2, 2), (1, 2), (2, 4)],
                         ids=["tp1", "kv-split", "kv-replicated-2", "kv-replicated-4"])
def test_sharded_deltas_make_the_whole_delta(kv_heads: int, size: int,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    adapters = _adapters(kv_heads)
    gen = torch.Generator().manual_seed(100)
    x = {"in": torch.randn(TOKENS, HIDDEN, generator=gen, dtype=torch.float64),
         "o_proj": torch.randn(TOKENS, HEADS * HEAD_DIM, generator=gen, dtype=torch.float64),
         "down_proj": torch.randn(TOKENS, INTER, generator=gen, dtype=torch.float64)}
    slots = torch.tensor([0, -1, 1, 1, -1, 0])
    want = {p: torch.zeros(TOKENS, projection_shapes(_Config(kv_heads))[p][1],
                           dtype=torch.float64) for p in STACKED | {"o_proj": 0, "down_proj": 0}}
    for t, slot in enumerate(slots.tolist()):
        for proj in want:
            if slot >= 0:
                want[proj][t] = _whole_delta(adapters[slot], proj, x.get(proj, x["in"])[t:t + 1])
    row_sums = {p: torch.zeros_like(want[p]) for p in ("o_proj", "down_proj")}
    for rank in range(size):
        state = _rank_state(kv_heads, rank, size, adapters, monkeypatch)
        state.indices = slots
        for proj, part in STACKED.items():
            lora = state.layers[(0, proj)]
            _, cols, width = lora.parts[part]
            y = torch.zeros(TOKENS, sum(n for _, _, n in lora.parts), dtype=torch.float64)
            lora.add_delta(x["in"], y)
            rows = _column_rows(proj, kv_heads, rank, size)
            assert width == rows.stop - rows.start
            torch.testing.assert_close(y[:, cols], want[proj][:, rows], rtol=1e-12, atol=1e-12)
        for proj in row_sums:
            width = x[proj].shape[1] // size
            partial = torch.zeros(TOKENS, HIDDEN, dtype=torch.float64)
            state.layers[(0, proj)].add_delta(x[proj][:, rank * width:(rank + 1) * width],
                                              partial)
            row_sums[proj] += partial
    for proj, total in row_sums.items():
        torch.testing.assert_close(total, want[proj], rtol=1e-12, atol=1e-12)
