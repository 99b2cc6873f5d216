"""What a Hugging Face checkpoint's config.json says about serving it: whether Baton runs its
architecture and how long a context it serves. Torch-free, so the gateway reads it without loading
the engine."""
from __future__ import annotations

import logging
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig

log = logging.getLogger(__name__)

# The architectures the engine's models implement (engine/models/loader.py maps each to its class).
ARCHITECTURES = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})


def load_config(model_dir: str | Path) -> PretrainedConfig:
    config = AutoConfig.from_pretrained(str(model_dir))
    archs = getattr(config, "architectures", None) or []
    if not any(a in ARCHITECTURES for a in archs):
        raise ValueError(f"unsupported architecture {archs}; supported: {sorted(ARCHITECTURES)}")
    return config


def head_dim(config: PretrainedConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def sliding_window(config: PretrainedConfig) -> int | None:
    """The attention window a checkpoint needs, if any (Mistral v0.1; Qwen2 only with
    use_sliding_window)."""
    window = getattr(config, "sliding_window", None)
    if config.model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
        return None
    return window


def context_length(config: PretrainedConfig, cap: int | None = None) -> int:
    """The longest sequence served: the model's positions, at most its attention window (windowed
    attention is not implemented, so longer would be wrong), at most `cap`. Raises ValueError when
    cap exceeds the model's."""
    limit = config.max_position_embeddings
    window = sliding_window(config)
    if window is not None and window < limit:
        log.warning(
            "capping context at the sliding window (%d tokens): windowed attention is "
            "not implemented",
            window)
        limit = window
    if cap is not None:
        if cap > limit:
            raise ValueError(f"max_model_len {cap} exceeds the model's limit of {limit}")
        limit = cap
    return limit
