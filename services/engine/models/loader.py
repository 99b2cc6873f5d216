"""Loads Hugging Face checkpoint folders (config.json + single or sharded safetensors) into Baton's models."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, PretrainedConfig

from baton.services.engine.attention import Attention
from baton.services.engine.models.llama import LlamaForCausalLM
from baton.services.engine.models.rope import RotaryEmbedding

log = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}
# Buffers some older checkpoints carry that are recomputed here.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_config(model_dir: str | Path) -> PretrainedConfig:
    config = AutoConfig.from_pretrained(str(model_dir))
    archs = getattr(config, "architectures", None) or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ValueError(f"unsupported architecture {archs}; supported: {sorted(SUPPORTED_ARCHITECTURES)}")
    return config


def head_dim(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def sliding_window(config: PretrainedConfig) -> int | None:
    """The attention window a checkpoint needs, if any (Mistral v0.1; Qwen2 only with use_sliding_window)."""
    window = getattr(config, "sliding_window", None)
    if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
        return None
    return window


def context_length(config: PretrainedConfig, cap: int | None = None) -> int:
    """The longest sequence served: the model's positions, at most its attention window (windowed attention is
    not implemented, so longer would be wrong), at most `cap`. Raises ValueError when cap exceeds the model's."""
    limit = config.max_position_embeddings
    window = sliding_window(config)
    if window is not None and window < limit:
        log.warning("capping context at the sliding window (%d tokens): windowed attention is not implemented",
                    window)
        limit = window
    if cap is not None:
        if cap > limit:
            raise ValueError(f"max_model_len {cap} exceeds the model's limit of {limit}")
        limit = cap
    return limit


def checkpoint_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / s for s in shards]
    single = model_dir / "model.safetensors"
    if single.exists():
        return [single]
    raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {model_dir}")


def load_model(model_dir: str | Path, config: PretrainedConfig, attention: Attention, dtype: torch.dtype,
               device: torch.device, max_positions: int) -> LlamaForCausalLM:
    """Builds the model without initializing it (meta tensors), then fills every parameter from the checkpoint."""
    cls = next(SUPPORTED_ARCHITECTURES[a] for a in config.architectures if a in SUPPORTED_ARCHITECTURES)
    with torch.device("meta"):
        model = cls(config, attention)
    model = model.to_empty(device=device).to(dtype)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for path in checkpoint_files(Path(model_dir)):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name.endswith(IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
                    continue
                if name not in params:
                    log.warning("checkpoint tensor %s has no place in the model; ignored", name)
                    continue
                with torch.no_grad():
                    params[name].copy_(f.get_tensor(name))
                loaded.add(name)
    model.tie_weights()
    missing = set(params) - loaded - ({"lm_head.weight"} if tied else set())
    if missing:
        raise ValueError(f"checkpoint {model_dir} lacks tensors: {sorted(missing)[:8]}")
    model.rope = RotaryEmbedding(config, head_dim(config), max_positions).to(device)
    return model.eval()
