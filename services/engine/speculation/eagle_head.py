"""EAGLE heads in their published checkpoint formats: one Llama decoder layer that drafts from the
target's own hidden states.

EAGLE-1/2 (e.g. yuhuili/EAGLE-LLaMA3-Instruct-8B: `fc.weight`, `layers.0.*`): at position j the
head reads the token after it, t[j+1], and the target's final hidden state h[j]; fc maps
[embed(t[j+1]), h[j]] to the layer's input (the first layer has no input norm), and the layer's
output, un-normed, is both the next position's hidden state and what the target's lm_head scores.

EAGLE-3 (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: `fc.weight`, `midlayer.*`, `norm.weight`,
`lm_head.weight`, `d2t`, `t2d`): h[j] is three of the target's layer inputs side by side (low, mid,
high), which fc fuses to one; the layer's attention reads [input_layernorm(embed), hidden_norm(h)]
(2 * hidden wide) and its normed output is scored by the head's own lm_head over a smaller draft
vocabulary, whose token d is the target's d + d2t[d]. Its output before the norm is the next
position's hidden state (already one wide: fc applies to the target's rows only).

Both share the target's token embedding; EAGLE-1 also its lm_head.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, PretrainedConfig

from baton.services.engine.layers.attention import Attention, AttentionMetadata
from baton.services.engine.layers.embedding import ParallelLMHead
from baton.services.engine.layers.linear import LinearBase, QKVParallelLinear
from baton.services.engine.layers.norm import RMSNorm
from baton.services.engine.layers.rotary import RotaryEmbedding
from baton.services.engine.models.llama import STACKED_PROJECTIONS, DecoderLayer
from baton.services.engine.models.loader import owner
from baton.services.engine.speculation.config import SpeculativeConfigError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Tensors a head checkpoint may carry that the head takes from the target instead.
SHARED = ("embed_tokens.weight", "model.embed_tokens.weight")


class EagleHead(nn.Module):
    stacked_projections = STACKED_PROJECTIONS

    def __init__(self, config: PretrainedConfig, attention: Attention, eagle3: bool,
                 fc_bias: bool) -> None:
        super().__init__()
        h = config.hidden_size
        self.eagle3 = eagle3
        self.fc = LinearBase((3 if eagle3 else 2) * h, h, bias=fc_bias)
        layer = DecoderLayer(config, 0, attention)
        attn = layer.self_attn
        if eagle3:
            attn.qkv_proj = QKVParallelLinear(2 * h, attn.head_dim, config.num_attention_heads,
                                              config.num_key_value_heads, bias=False)
            layer.hidden_norm = RMSNorm(h, config.rms_norm_eps)
            self.midlayer = layer
            self.norm = RMSNorm(h, config.rms_norm_eps)
            self.lm_head = ParallelLMHead(config.draft_vocab_size, h)
            self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        else:
            # The first layer of an EAGLE-1 head reads fc's output un-normed.
            del layer.input_layernorm
            self.layers = nn.ModuleList([layer])
        self.rope: RotaryEmbedding | None = None

    @property
    def layer(self) -> DecoderLayer:
        return self.midlayer if self.eagle3 else self.layers[0]

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """embeds: the tokens after each position; hidden: the target's rows (or the head's own
        from the previous position). Returns (what the lm_head scores, the next hidden state)."""
        layer = self.layer
        if not self.eagle3:
            x = self.fc(torch.cat((embeds, hidden), dim=-1))
            h = layer.self_attn(x, positions, self.rope, meta)
            h, residual = layer.post_attention_layernorm.add_and_norm(h, x)
            out = layer.mlp(h) + residual
            return out, out
        if hidden.shape[-1] != embeds.shape[-1]:
            hidden = self.fc(hidden)
        x = torch.cat((layer.input_layernorm(embeds), layer.hidden_norm(hidden)), dim=-1)
        h = layer.self_attn(x, positions, self.rope, meta)
        h, residual = layer.post_attention_layernorm.add_and_norm(h, hidden)
        return self.norm.add_and_norm(layer.mlp(h), residual)

    def draft_logits(self, out: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """EAGLE-3: float32 logits over the target's vocabulary, -inf where the draft vocabulary
        has no token."""
        logits = self.lm_head(out).float()
        full = logits.new_full((logits.shape[0], vocab_size), float("-inf"))
        full[:, torch.arange(len(self.d2t), device=out.device) + self.d2t] = logits
        return full


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        if name.endswith(".safetensors"):
            from safetensors.torch import load_file
            return load_file(str(path))
        return torch.load(str(path), map_location="cpu", weights_only=True)
    raise SpeculativeConfigError(
        f"speculative config: EAGLE head {str(folder)!r} has no weights (looked for "
        f"{' or '.join(WEIGHT_FILES)})")


def load_head(folder: Path, config: LlamaConfig, attention: Attention, eagle3: bool,
              dtype: torch.dtype, device: torch.device) -> EagleHead:
    """The head with every parameter from its checkpoint; a tensor of the wrong shape or one
    missing is a SpeculativeConfigError naming it."""
    tensors = _tensors(folder)
    with torch.device("meta"):
        head = EagleHead(config, attention, eagle3, fc_bias="fc.bias" in tensors)
    head = head.to_empty(device=device).to(dtype)
    params = dict(head.named_parameters())
    rows: dict[str, int] = {}
    try:
        for name, tensor in tensors.items():
            if name in ("d2t", "t2d") or name in SHARED:
                continue
            module, leaf, part = owner(head, name)
            if f"{module}.{leaf}" in params:
                got = head.get_submodule(module).weight_loader(params[f"{module}.{leaf}"],
                                                               tensor, name, part)
                rows[f"{module}.{leaf}"] = rows.get(f"{module}.{leaf}", 0) + got
        if eagle3:
            _load_vocab_map(head, tensors, config)
    except ValueError as e:
        raise SpeculativeConfigError(f"speculative config: EAGLE head {str(folder)!r}: {e}"
                                     ) from None
    missing = [n for n, p in params.items() if rows.get(n, 0) < p.shape[0]]
    if missing:
        raise SpeculativeConfigError(f"speculative config: EAGLE head {str(folder)!r} lacks "
                                     f"tensors for: {missing[:8]}")
    return head.eval()


def _load_vocab_map(head: EagleHead, tensors: dict[str, torch.Tensor],
                    config: LlamaConfig) -> None:
    """d2t: each draft token's offset to its target token (none: the vocabularies are one)."""
    d2t = tensors.get("d2t")
    if d2t is None:
        if config.draft_vocab_size != config.vocab_size:
            raise ValueError("a draft vocabulary smaller than the target's needs d2t")
        head.d2t.zero_()
        return
    if tuple(d2t.shape) != (config.draft_vocab_size,):
        raise ValueError(f"d2t has shape {tuple(d2t.shape)}, expected "
                         f"({config.draft_vocab_size},) (draft_vocab_size)")
    target = torch.arange(len(d2t)) + d2t.long()
    if target.min() < 0 or target.max() >= config.vocab_size or len(set(target.tolist())) < len(
            target):
        raise ValueError("d2t maps draft tokens outside the target's vocabulary or onto one "
                         "target token twice")
    head.d2t.copy_(d2t)
