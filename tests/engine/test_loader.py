"""Checkpoint loading into the model's stacked projections, and the errors for checkpoints that do
not fit it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig

from baton.services.engine.layers.attention import Attention
from baton.services.engine.models.loader import load_model


def load(model_dir: Path) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(model_dir)
    return load_model(model_dir, config, Attention(1.0, "torch", 16), torch.float32,
                      torch.device("cpu"), max_positions=64)


def edited_copy(model_dir: Path, dst: Path, edit) -> Path:
    """model_dir's checkpoint with edit(tensors) applied, in dst."""
    shutil.copytree(model_dir, dst)
    tensors = load_file(dst / "model.safetensors")
    edit(tensors)
    save_file(tensors, dst / "model.safetensors")
    return dst


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_stacked_rows_hold_the_checkpoint_tensors(arch: str,
                                                  tiny_model_dirs: dict[str, Path]) -> None:
    saved = load_file(tiny_model_dirs[arch] / "model.safetensors")
    params = dict(load(tiny_model_dirs[arch]).named_parameters())
    attn, mlp = "model.layers.1.self_attn", "model.layers.1.mlp"
    kinds = ("weight", "bias") if arch == "qwen2" else ("weight",)  # qwen2 has q/k/v biases
    for kind in kinds:
        parts = [saved[f"{attn}.{p}_proj.{kind}"] for p in "qkv"]
        assert torch.equal(params[f"{attn}.qkv_proj.{kind}"], torch.cat(parts))
    gate_up = torch.cat([saved[f"{mlp}.gate_proj.weight"], saved[f"{mlp}.up_proj.weight"]])
    assert torch.equal(params[f"{mlp}.gate_up_proj.weight"], gate_up)


def test_missing_part_of_a_stacked_projection_is_named(tiny_model_dirs: dict[str, Path],
                                                        tmp_path: Path) -> None:
    model_dir = edited_copy(tiny_model_dirs["llama"], tmp_path / "m",
                            lambda t: t.pop("model.layers.0.self_attn.v_proj.weight"))
    stacked = "model.layers.0.self_attn.qkv_proj"
    with pytest.raises(ValueError, match=rf"lacks tensors for: \['{stacked}"):
        load(model_dir)


def test_wrongly_shaped_tensor_is_refused_not_broadcast(tiny_model_dirs: dict[str, Path],
                                                        tmp_path: Path) -> None:
    name = "model.layers.0.self_attn.k_proj.weight"

    def shrink(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name] = tensors[name][:1].contiguous()  # one row: copy_ would broadcast it

    model_dir = edited_copy(tiny_model_dirs["llama"], tmp_path / "m", shrink)
    with pytest.raises(ValueError, match=f"{name} has shape"):
        load(model_dir)
