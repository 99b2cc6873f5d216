"""Loads Hugging Face checkpoint folders (config.json + single or sharded safetensors) into Baton's
models."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import PretrainedConfig

from baton.services.common.model_config import ARCHITECTURES, head_dim
from baton.services.engine.attention import Attention
from baton.services.engine.models.llama import STACKED_PROJECTIONS, LlamaForCausalLM
from baton.services.engine.models.rope import RotaryEmbedding

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


def destination(model: torch.nn.Module, name: str) -> tuple[str, slice]:
    """The parameter checkpoint tensor `name` fills, and which of its rows (all but for the
    projections the model stacks, see STACKED_PROJECTIONS)."""
    module, _, leaf = name.rpartition(".")
    parent, _, projection = module.rpartition(".")
    if projection not in STACKED_PROJECTIONS:
        return name, slice(None)
    fused, part = STACKED_PROJECTIONS[projection]
    sizes = model.get_submodule(parent).part_sizes[fused]
    start = sum(sizes[:part])
    return f"{parent}.{fused}.{leaf}", slice(start, start + sizes[part])


def _fill(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    # copy_ would broadcast a wrongly shaped tensor silently.
    if dst.shape != src.shape:
        raise ValueError(f"checkpoint tensor {name} has shape {tuple(src.shape)}; the model "
                         f"expects {tuple(dst.shape)}")
    with torch.no_grad():
        dst.copy_(src)


def load_model(model_dir: str | Path, config: PretrainedConfig, attention: Attention,
               dtype: torch.dtype, device: torch.device, max_positions: int) -> LlamaForCausalLM:
    """Builds the model without initializing it (meta tensors), then fills every parameter from the
    checkpoint."""
    cls = next(SUPPORTED_ARCHITECTURES[a] for a in config.architectures
               if a in SUPPORTED_ARCHITECTURES)
    with torch.device("meta"):
        model = cls(config, attention)
    model = model.to_empty(device=device).to(dtype)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    params = dict(model.named_parameters())
    rows_filled: dict[str, int] = {}
    for path in checkpoint_files(Path(model_dir)):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
                    continue
                target, rows = destination(model, name)
                if target not in params:
                    log.warning("checkpoint tensor %s has no place in the model; ignored", name)
                    continue
                dst = params[target][rows]
                _fill(dst, f.get_tensor(name), name)
                rows_filled[target] = rows_filled.get(target, 0) + dst.shape[0]
    model.tie_weights()
    missing = [
        n for n, p in params.items()
        if rows_filled.get(n, 0) < p.shape[0] and not (tied and n == "lm_head.weight")
    ]
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks tensors for: {missing[:8]}")
    model.rope = RotaryEmbedding(config, head_dim(config), max_positions).to(device)
    return model.eval()
