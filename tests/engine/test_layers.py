"""The engine's layers: each loads its own parameters from checkpoint tensors (whole or lazy
safetensors slices, stacked projections by part), refuses a wrongly shaped one by name, and
computes exactly what the torch module it replaces computes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers import AutoConfig

from baton.services.engine.layers.attention import Attention
from baton.services.engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from baton.services.engine.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                                 RowParallelLinear)
from baton.services.engine.models.loader import SUPPORTED_ARCHITECTURES, owner

HIDDEN, HEAD_DIM, HEADS, KV_HEADS = 8, 2, 4, 2


def qkv_checkpoint(gen: torch.Generator) -> dict[str, torch.Tensor]:
    """q, k and v weights and biases shaped for a QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS,
    KV_HEADS)."""
    rows = {"q": HEADS * HEAD_DIM, "k": KV_HEADS * HEAD_DIM, "v": KV_HEADS * HEAD_DIM}
    tensors = {f"{p}_proj.weight": torch.randn(n, HIDDEN, generator=gen) for p, n in rows.items()}
    tensors |= {f"{p}_proj.bias": torch.randn(n, generator=gen) for p, n in rows.items()}
    return tensors


def load_qkv(layer: QKVParallelLinear, tensors: dict) -> list[int]:
    """Loads parts 0, 1, 2 from tensors (or lazy slices) named as qkv_checkpoint names them."""
    params = dict(layer.named_parameters())
    return [layer.weight_loader(params[kind], tensors[f"{p}_proj.{kind}"], f"{p}_proj.{kind}",
                                part)
            for kind in ("weight", "bias") for part, p in enumerate("qkv")]


@pytest.mark.parametrize("lazy", [False, True])
def test_qkv_parts_fill_their_rows(lazy: bool, tmp_path: Path) -> None:
    tensors = qkv_checkpoint(torch.Generator().manual_seed(0))
    layer = QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS, bias=True)
    if lazy:
        save_file(tensors, tmp_path / "t.safetensors")
        with safe_open(str(tmp_path / "t.safetensors"), framework="pt", device="cpu") as f:
            filled = load_qkv(layer, {name: f.get_slice(name) for name in f.keys()})
    else:
        filled = load_qkv(layer, tensors)
    assert filled == [8, 4, 4] * 2
    for kind in ("weight", "bias"):
        want = torch.cat([tensors[f"{p}_proj.{kind}"] for p in "qkv"])
        assert torch.equal(getattr(layer, kind), want)


def test_merged_parts_and_an_already_stacked_tensor() -> None:
    gen = torch.Generator().manual_seed(1)
    gate, up = torch.randn(6, HIDDEN, generator=gen), torch.randn(6, HIDDEN, generator=gen)
    parts = MergedColumnParallelLinear(HIDDEN, [6, 6], bias=False)
    parts.weight_loader(parts.weight, up, "up_proj.weight", 1)
    parts.weight_loader(parts.weight, gate, "gate_proj.weight", 0)
    whole = MergedColumnParallelLinear(HIDDEN, [6, 6], bias=False)
    assert whole.weight_loader(whole.weight, torch.cat([gate, up]), "gate_up_proj.weight") == 12
    assert torch.equal(parts.weight, torch.cat([gate, up]))
    assert torch.equal(whole.weight, parts.weight)


def test_a_part_of_another_size_is_refused_by_name() -> None:
    tensors = qkv_checkpoint(torch.Generator().manual_seed(2))
    layer = QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS, bias=True)
    nn.init.zeros_(layer.weight)
    # q's shape offered as k's: copy_ would have failed or broadcast; the message names it.
    with pytest.raises(ValueError, match=r"k_proj.weight has shape \(8, 8\); the model expects "
                       r"\(4, 8\)"):
        layer.weight_loader(layer.weight, tensors["q_proj.weight"], "k_proj.weight", 1)
    assert not layer.weight.any()  # nothing copied


@pytest.mark.parametrize("bias", [False, True])
def test_projections_compute_what_nn_linear_does(bias: bool) -> None:
    """Bit for bit: outputs must stay equal to transformers', which uses nn.Linear."""
    torch.manual_seed(3)
    ref = nn.Linear(HIDDEN, 12, bias=bias)
    x = torch.randn(5, HIDDEN)
    layers = [RowParallelLinear(HIDDEN, 12, bias), MergedColumnParallelLinear(HIDDEN, [6, 6], bias)]
    for layer in layers:
        for name, param in ref.named_parameters():
            layer.weight_loader(dict(layer.named_parameters())[name], param.detach(), name)
        assert torch.equal(layer(x), ref(x))


def test_embedding_and_lm_head_compute_what_torch_does() -> None:
    torch.manual_seed(4)
    table = torch.randn(20, HIDDEN)
    embed, head = VocabParallelEmbedding(20, HIDDEN), ParallelLMHead(20, HIDDEN)
    for layer in (embed, head):
        assert layer.weight_loader(layer.weight, table, "embed_tokens.weight") == 20
    ids, hidden = torch.tensor([3, 0, 19, 3]), torch.randn(4, HIDDEN)
    assert torch.equal(embed(ids), nn.Embedding.from_pretrained(table)(ids))
    lm_head = nn.Linear(HIDDEN, 20, bias=False)
    lm_head.weight.data.copy_(table)
    assert torch.equal(head(hidden), lm_head(hidden))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_every_parameter_belongs_to_a_loading_layer(arch: str,
                                                    tiny_model_dirs: dict[str, Path]) -> None:
    """A model built of plain torch modules would leave the loader nothing to ask."""
    config = AutoConfig.from_pretrained(tiny_model_dirs[arch])
    with torch.device("meta"):
        model = SUPPORTED_ARCHITECTURES[config.architectures[0]](config,
                                                                 Attention(1.0, "torch", 16))
    for name, _ in model.named_parameters():
        module, leaf, part = owner(model, name)
        assert (f"{module}.{leaf}", part) == (name, None)
        assert callable(getattr(model.get_submodule(module), "weight_loader", None)), name
    assert owner(model, "model.layers.3.self_attn.v_proj.bias") == (
        "model.layers.3.self_attn.qkv_proj", "bias", 2)
