"""Rotary position embeddings, as a cos/sin table indexed by position.

Inverse frequencies come from transformers' own rope initializers, so every scaling type they
implement statically (default, linear, llama3, yarn) matches the checkpoint's reference
implementation exactly.
"""
from __future__ import annotations

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# These recompute frequencies per sequence length; a position-indexed table cannot represent them.
UNSUPPORTED_ROPE_TYPES = ("dynamic", "longrope")


def rope_type(config: PretrainedConfig) -> str:
    params = getattr(config, "rope_parameters", None) or {}
    return params.get("rope_type", "default")


class RotaryEmbedding(torch.nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int) -> None:
        super().__init__()
        kind = rope_type(config)
        if kind in UNSUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"rope_type {kind!r} is not supported (position-dependent frequencies)")
        if kind == "default":
            base = config.rope_parameters["rope_theta"]
            inv_freq = 1.0 / (base**(torch.arange(0, head_dim, 2, dtype=torch.int64).float() /
                                     head_dim))
            scaling = 1.0
        else:
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](config, torch.device("cpu"))
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, Hq, D], k: [T, Hkv, D]; on CUDA rotated in place by one fused kernel."""
        if q.is_cuda:
            from baton.kernels.rotary import apply_rotary
            # In place: q and k are fresh projection outputs that nothing else reads.
            apply_rotary(q, k, self.cos, self.sin, positions)
            return q, k
        # In the activations' dtype, as transformers does.
        c = self.cos[positions].to(q.dtype).unsqueeze(1)
        s = self.sin[positions].to(q.dtype).unsqueeze(1)
        return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
