"""Draft models for the speculation tests: a checkpoint's copy with noise on its weights, which
agrees with the original on some tokens and not others."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"


def perturbed_copy(src: Path, dst: Path, scale: float, seed: int = 0) -> Path:
    """src's checkpoint at dst, each weight plus Gaussian noise of scale times its own spread."""
    if (dst / WEIGHTS).exists():
        return dst
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(WEIGHTS))
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, w in load_file(src / WEIGHTS).items():
        noise = torch.randn(w.shape, generator=g, dtype=torch.float32) * scale * w.float().std()
        weights[name] = (w.float() + noise).to(w.dtype).contiguous()
    save_file(weights, dst / WEIGHTS, metadata={"format": "pt"})
    return dst
