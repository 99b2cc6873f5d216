"""Random LoRA adapters for a checkpoint, in PEFT's own layout (adapter_config.json with PEFT's
keys, adapter_model.safetensors named as `peft` saves them), so that `peft` loads them as it loads a
trained adapter: test fixtures and the LoRA benchmark's adapters. Unlike PEFT's initialization, B is
random too, so an adapter really changes the model's outputs."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def _shapes(config: AutoConfig) -> dict[str, tuple[int, int]]:
    hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    hidden, inter = config.hidden_size, config.intermediate_size
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "o_proj": (q, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def make_tiny_lora(model_dir: Path, out_dir: Path, rank: int, targets: tuple[str, ...],
                   seed: int, alpha: float | None = None, rslora: bool = False,
                   std: float = 0.2) -> Path:
    """Writes a random adapter of `rank` on `targets` of every layer of model_dir into out_dir."""
    config = AutoConfig.from_pretrained(str(model_dir))
    gen = torch.Generator().manual_seed(seed)
    shapes = _shapes(config)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for proj in targets:
            fan_in, fan_out = shapes[proj]
            block = "self_attn" if proj in ATTENTION else "mlp"
            key = f"base_model.model.model.layers.{layer}.{block}.{proj}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) * std
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * std
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model_dir),
        "r": rank, "lora_alpha": alpha if alpha is not None else 2 * rank, "lora_dropout": 0.0,
        "target_modules": list(targets), "bias": "none", "use_rslora": rslora,
        "fan_in_fan_out": False, "inference_mode": True}, indent=2))
    return out_dir
