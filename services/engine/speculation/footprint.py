"""What a draft model or an EAGLE head will take of the device beside the target, known before
either loads: so that a target cache sized from memory leaves room for the draft's weights and for
its cache, which has as many blocks as the target's (draft_model.py, eagle.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from transformers import PretrainedConfig

from baton.services.common.model_config import load_config
from baton.services.engine.kv.kv_cache import block_bytes
from baton.services.engine.models.loader import checkpoint_files
from baton.services.engine.speculation.config import parse_speculative_config


@dataclass(frozen=True)
class DraftFootprint:
    weight_bytes: int  # the draft's (or head's) parameters in the serving dtype
    block_bytes: int  # one block of its cache, all of its layers


def _numel(folder: Path) -> int:
    """Elements of the checkpoint's floating-point tensors, read from the files' headers (a
    pytorch_model.bin is memory-mapped, not read)."""
    bin_file = folder / "pytorch_model.bin"
    if not list(folder.glob("*.safetensors")) and bin_file.is_file():
        tensors = torch.load(str(bin_file), map_location="cpu", weights_only=True, mmap=True)
        return sum(t.numel() for t in tensors.values() if t.is_floating_point())
    try:
        files = checkpoint_files(folder)
    except FileNotFoundError:
        return 0  # refused by name where the weights load
    total = 0
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                sliced = f.get_slice(name)
                if sliced.get_dtype().startswith(("F", "BF")):
                    total += math.prod(sliced.get_shape())
    return total


def draft_footprint(speculative_config: str | None, target: PretrainedConfig, block_size: int,
                    dtype: torch.dtype, tensor_parallel_size: int = 1) -> DraftFootprint | None:
    """The footprint of the config's draft model or head (None for n-gram or no speculation):
    under tensor parallelism an EAGLE-1 head's includes rank 0's copy of the target's lm_head."""
    spec = parse_speculative_config(speculative_config)
    if spec is None or spec.model is None:
        return None
    folder = Path(spec.model)
    if spec.method == "draft_model":
        config = load_config(folder)
    else:
        # Imported here: eagle_config reads the speculation config's error.
        from baton.services.engine.speculation.eagle_config import head_config
        config = head_config(folder, spec.method == "eagle3", target)
    itemsize = torch.finfo(dtype).bits // 8
    weights = _numel(folder) * itemsize
    if spec.method == "eagle" and tensor_parallel_size > 1:
        from baton.services.engine.speculation.eagle_vocab import lm_head_bytes
        weights += lm_head_bytes(target, dtype)
    return DraftFootprint(weights, block_bytes(config, block_size, dtype))
