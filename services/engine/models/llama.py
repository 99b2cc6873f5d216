"""The Llama family (Llama 2/3/3.1, Mistral, Qwen2/2.5, Qwen3) over a paged KV cache, composed of
services/engine/layers.

Tokens of all sequences in a step are packed flat ([num_tokens, hidden]); attention reads and writes
the paged cache through the step's AttentionMetadata. Module names mirror transformers', except that
q/k/v and gate/up are stacked into one projection each (STACKED_PROJECTIONS; the loader hands each
checkpoint tensor to its layer with its part); the arithmetic follows transformers' order so float32
outputs match it.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from baton.services.engine.layers.activation import SiluAndMul
from baton.services.engine.layers.attention import Attention, AttentionMetadata
from baton.services.engine.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from baton.services.engine.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                                 RowParallelLinear)
from baton.services.engine.layers.norm import RMSNorm
from baton.services.engine.layers.rotary import RotaryEmbedding

# Checkpoint projections that load as parts of one stacked projection: (stacked name, part).
STACKED_PROJECTIONS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def _has_qkv_bias(config: PretrainedConfig) -> bool:
    # Qwen2 always has q/k/v biases; Llama-style configs say so in attention_bias.
    return config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False))


class SelfAttention(nn.Module):
    def __init__(self, config: PretrainedConfig, layer_idx: int, attention: Attention) -> None:
        super().__init__()
        heads = config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.qkv_proj = QKVParallelLinear(config.hidden_size, self.head_dim, heads,
                                          config.num_key_value_heads, bias=_has_qkv_bias(config))
        # This rank's heads (all of them at TP=1).
        self.num_heads = self.qkv_proj.split.num_heads
        self.num_kv_heads = self.qkv_proj.split.num_kv_heads
        self.o_proj = RowParallelLinear(
            heads * self.head_dim, config.hidden_size,
            bias=config.model_type != "qwen2" and bool(getattr(config, "attention_bias", False)))
        if config.model_type == "qwen3":
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.layer_idx = layer_idx
        self.attention = attention

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryEmbedding,
                meta: AttentionMetadata) -> torch.Tensor:
        t = x.shape[0]
        # Views into the stacked output: the kernels and the cache write take strided rows.
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.part_sizes, dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, k, positions)
        out = self.attention(self.layer_idx, q, k, v, meta)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size,
                                                       [config.intermediate_size] * 2, bias=bias)
        self.down_proj = RowParallelLinear(config.intermediate_size, config.hidden_size,
                                           bias=bias)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, layer_idx: int, attention: Attention) -> None:
        super().__init__()
        self.self_attn = SelfAttention(config, layer_idx, attention)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                rope: RotaryEmbedding,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this layer's MLP output, the residual stream before it): the next norm adds the
        two."""
        if residual is None:
            h, residual = self.input_layernorm(x), x
        else:
            h, residual = self.input_layernorm.add_and_norm(x, residual)
        h = self.self_attn(h, positions, rope, meta)
        h, residual = self.post_attention_layernorm.add_and_norm(h, residual)
        return self.mlp(h), residual


class Backbone(nn.Module):
    def __init__(self, config: PretrainedConfig, attention: Attention) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, attention) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    # Read by the loader: which checkpoint tensors are parts of which layer.
    stacked_projections = STACKED_PROJECTIONS

    def __init__(self, config: PretrainedConfig, attention: Attention) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config, attention)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        # built by the loader on the real device, after weights
        self.rope: RotaryEmbedding | None = None
        # Layers whose input (the residual stream there) forward keeps in `captured`, side by
        # side in this order: what an EAGLE-3 head reads (speculation/eagle.py).
        self.capture_layers: tuple[int, ...] = ()
        self.captured: torch.Tensor | None = None

    def tie_weights(self) -> None:
        if getattr(self.config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        x, residual = self.model.embed_tokens(input_ids), None
        kept: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            if i in self.capture_layers:
                kept[i] = x if residual is None else x + residual
            x, residual = layer(x, residual, positions, self.rope, meta)
        if kept:
            self.captured = torch.cat([kept[i] for i in self.capture_layers], dim=-1)
        return self.model.norm.add_and_norm(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """float32 logits; under tensor parallelism on rank 0 only (the others get None)."""
        logits = self.lm_head(hidden)
        return None if logits is None else logits.float()
