"""Loads Hugging Face checkpoint folders (config.json + single or sharded safetensors) into Baton's
models: each checkpoint tensor goes to the layer that owns it, which copies it in."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import PretrainedConfig

from baton.services.common.model_config import ARCHITECTURES, head_dim
from baton.services.engine.layers.attention import Attention
from baton.services.engine.layers.rotary import RotaryEmbedding
from baton.services.engine.models.llama import LlamaForCausalLM

log = logging.getLogger(__name__)

# Every architecture common/model_config.ARCHITECTURES names runs on the one Llama-style model.
SUPPORTED_ARCHITECTURES = {name: LlamaForCausalLM for name in ARCHITECTURES}
# Buffers some older checkpoints carry that are recomputed here.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / s for s in shards]
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {model_dir}")


def owner(model: torch.nn.Module, name: str) -> tuple[str, str, int | None]:
    """(module path, parameter name, part) for checkpoint tensor `name`: the module is the layer
    that loads it, and part is None but for the projections the model stacks
    (`stacked_projections`)."""
    module, _, leaf = name.rpartition(".")
    parent, _, projection = module.rpartition(".")
    if projection not in model.stacked_projections:
        return module, leaf, None
    stacked, part = model.stacked_projections[projection]
    return f"{parent}.{stacked}", leaf, part


def _load_file(model: torch.nn.Module, path: Path, params: dict[str, torch.nn.Parameter],
               skip: set[str], rows_filled: dict[str, int]) -> None:
    """Hands every tensor of one safetensors file to its layer, adding the rows each parameter got
    to rows_filled."""
    with safe_open(str(path), framework="pt", device="cpu") as f:
        for name in f.keys():
            if name.endswith(IGNORED_SUFFIXES) or name in skip:
                continue
            module, leaf, part = owner(model, name)
            target = f"{module}.{leaf}"
            if target not in params:
                log.warning("checkpoint tensor %s has no place in the model; ignored", name)
                continue
            layer = model.get_submodule(module)
            # A lazy slice: the layer reads only what it keeps.
            rows = layer.weight_loader(params[target], f.get_slice(name), name, part)
            rows_filled[target] = rows_filled.get(target, 0) + rows


def load_model(model_dir: str | Path, config: PretrainedConfig, attention: Attention,
               dtype: torch.dtype, device: torch.device, max_positions: int) -> LlamaForCausalLM:
    """Builds the model without initializing it (meta tensors), then fills every parameter from the
    checkpoint."""
    cls = next(SUPPORTED_ARCHITECTURES[a] for a in config.architectures
               if a in SUPPORTED_ARCHITECTURES)
    with torch.device("meta"):
        model = cls(config, attention)
    model = model.to_empty(device=device).to(dtype)
    # With tied embeddings the lm_head's weight is the embedding's, set after loading.
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    params = dict(model.named_parameters())
    rows_filled: dict[str, int] = {}
    for path in checkpoint_files(Path(model_dir)):
        _load_file(model, path, params, tied, rows_filled)
    model.tie_weights()
    missing = [n for n, p in params.items() if rows_filled.get(n, 0) < p.shape[0] and n not in tied]
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks tensors for: {missing[:8]}")
    model.rope = RotaryEmbedding(config, head_dim(config), max_positions).to(device)
    return model.eval()
