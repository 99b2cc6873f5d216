"""A PEFT LoRA checkpoint (adapter_config.json + adapter_model.safetensors), read into host memory
and checked against the base model: rank, scaling (lora_alpha / r, or / sqrt(r) with rsLoRA),
target modules and every tensor's shape. Anything else is refused by name, so a bad adapter is a
clear error and never a wrong answer."""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import PretrainedConfig

from baton.services.common.model_config import head_dim
from baton.services.engine.lora.modules import LoRAError

# The decoder projections an adapter may target, as transformers names them.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


def projection_shapes(config: PretrainedConfig) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each projection of the base model."""
    hidden, inter, hd = config.hidden_size, config.intermediate_size, head_dim(config)
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv),
            "o_proj": (q, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


@dataclass
class AdapterWeights:
    """An adapter in host memory: per (layer, projection), A [r, in] and B [out, r] in float32."""
    name: str
    rank: int
    scaling: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)

    @property
    def target_modules(self) -> list[str]:
        return sorted({proj for _, proj in self.weights})


def _read_config(path: Path, max_rank: int) -> tuple[int, float]:
    """(rank, scaling) from adapter_config.json, refusing what this engine does not apply."""
    try:
        cfg = json.loads((path / "adapter_config.json").read_text())
    except FileNotFoundError:
        raise LoRAError(f"{path} has no adapter_config.json (not a PEFT adapter)") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LoRAError(f"{path}/adapter_config.json is unreadable: {e}") from None
    if not isinstance(cfg, dict) or cfg.get("peft_type", "LORA") != "LORA":
        raise LoRAError(f"{path}: only LoRA adapters are supported (peft_type LORA)")
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha", cfg.get("r"))
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, (int, float)):
        raise LoRAError(f"{path}: adapter_config.json needs a positive integer r and lora_alpha")
    if rank > max_rank:
        raise LoRAError(f"{path}: LoRA rank {rank} is above --max-lora-rank {max_rank}")
    for key in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save"):
        if cfg.get(key):
            raise LoRAError(f"{path}: adapter_config.json sets {key}, which is not supported")
    if cfg.get("bias", "none") != "none":
        raise LoRAError(f"{path}: LoRA bias {cfg['bias']!r} is not supported (only 'none')")
    targets = cfg.get("target_modules")
    if isinstance(targets, list):
        missing = sorted(set(targets) - set(PROJECTIONS))
        if missing:
            raise LoRAError(f"{path}: target modules {missing} are not projections of this model "
                            f"(it has {list(PROJECTIONS)})")
    scaling = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    file = path / "adapter_model.safetensors"
    if not file.exists():
        raise LoRAError(f"{path} has no adapter_model.safetensors")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise LoRAError(f"{file} is corrupt or truncated: {e}") from None


def read_adapter(name: str, path: str | Path, config: PretrainedConfig,
                 max_rank: int) -> AdapterWeights:
    """Reads and checks an adapter against the base model `config`. Raises LoRAError."""
    path = Path(path)
    if not path.is_dir():
        raise LoRAError(f"LoRA adapter {name!r}: {path} is not a folder")
    rank, scaling = _read_config(path, max_rank)
    shapes = projection_shapes(config)
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in _read_tensors(path).items():
        match = _KEY.search(key)
        if match is None or match.group(2) not in shapes:
            raise LoRAError(f"{path}: tensor {key} is not a LoRA weight of a projection this model "
                            f"has ({', '.join(PROJECTIONS)})")
        layer, proj, half = int(match.group(1)), match.group(2), match.group(3)
        if layer >= config.num_hidden_layers:
            raise LoRAError(f"{path}: tensor {key} is for layer {layer}; the base model has "
                            f"{config.num_hidden_layers} layers (an adapter of another model?)")
        fan_in, fan_out = shapes[proj]
        want = (rank, fan_in) if half == "A" else (fan_out, rank)
        if tuple(tensor.shape) != want:
            raise LoRAError(f"{path}: tensor {key} has shape {tuple(tensor.shape)}; this base "
                            f"model needs {want} (an adapter of another model?)")
        halves.setdefault((layer, proj), {})[half] = tensor.float()
    incomplete = sorted(f"layer {k[0]} {k[1]}" for k, v in halves.items() if len(v) != 2)
    if incomplete:
        raise LoRAError(f"{path}: lora_A or lora_B missing for {incomplete}")
    if not halves:
        raise LoRAError(f"{path}: the adapter holds no LoRA weights")
    weights = {k: (v["A"], v["B"]) for k, v in halves.items()}
    return AdapterWeights(name, rank, scaling, weights)
