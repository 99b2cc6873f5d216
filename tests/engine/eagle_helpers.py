"""EAGLE heads for the speculation tests, written as the published checkpoints are: config.json and
model.safetensors with EAGLE-1's fc / layers.0.* or EAGLE-3's fc / midlayer.* / norm / lm_head /
d2t / t2d tensors, random or constructed to agree with a target."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"


def _layer(prefix: str, cfg: dict, attn_in: int, g: torch.Generator,
           std: float) -> dict[str, torch.Tensor]:
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    q, kv, inter = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd, \
        cfg["intermediate_size"]
    shapes = {"self_attn.q_proj.weight": (q, attn_in), "self_attn.k_proj.weight": (kv, attn_in),
              "self_attn.v_proj.weight": (kv, attn_in), "self_attn.o_proj.weight": (h, q),
              "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
              "mlp.down_proj.weight": (h, inter)}
    out = {f"{prefix}.{k}": torch.randn(s, generator=g) * std for k, s in shapes.items()}
    out[f"{prefix}.post_attention_layernorm.weight"] = torch.ones(h)
    return out


def head_config(target: Path, eagle3: bool, **overrides) -> dict:
    t = json.loads((target / "config.json").read_text())
    cfg = {"architectures": ["LlamaForCausalLMEagle3" if eagle3 else "LlamaForCausalLM"],
           "model_type": "llama", "hidden_size": t["hidden_size"], "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 128, "vocab_size": t["vocab_size"], "rms_norm_eps": 1e-6,
           "rope_theta": t.get("rope_theta", 10000.0),
           "max_position_embeddings": t["max_position_embeddings"], "torch_dtype": "float32"}
    if eagle3:
        cfg["draft_vocab_size"] = t["vocab_size"] // 2
        # The tiny targets have two layers: vLLM's default (2, n // 2, n - 3) needs five.
        cfg["eagle_aux_hidden_state_layer_ids"] = [0, 1, 1]
    return {**cfg, **overrides}


def make_head(target: Path, out: Path, eagle3: bool, seed: int = 0, std: float = 0.3,
              **overrides) -> Path:
    """A random head for target at out, in the published layout."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = head_config(target, eagle3, **overrides)
    g = torch.Generator().manual_seed(seed)
    h = cfg["hidden_size"]
    if eagle3:
        w = _layer("midlayer", cfg, 2 * h, g, std)
        draft, vocab = cfg["draft_vocab_size"], cfg["vocab_size"]
        # Every other target token is in the draft vocabulary: d2t[d] = d (target 2d).
        d2t = torch.arange(draft)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[2 * d2t] = True
        w |= {"fc.weight": torch.randn(h, 3 * h, generator=g) * std / 3,
              "midlayer.input_layernorm.weight": torch.ones(h),
              "midlayer.hidden_norm.weight": torch.ones(h), "norm.weight": torch.ones(h),
              "lm_head.weight": torch.randn(draft, h, generator=g) * std, "d2t": d2t,
              "t2d": t2d}
    else:
        w = _layer("layers.0", cfg, h, g, std)
        w["fc.weight"] = torch.randn(h, 2 * h, generator=g) * std / 2
    (out / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in w.items()}, out / WEIGHTS, metadata={"format": "pt"})
    return out


def _zero_layers(w: dict[str, torch.Tensor]) -> None:
    """Every layer's output projections zeroed: each layer adds nothing to the residual stream."""
    for name in w:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            w[name] = torch.zeros_like(w[name])


def bigram_target(src: Path, dst: Path, repeat: bool = False) -> Path:
    """src (untied) with layers that add nothing and a final norm of ones: its next token after t
    is argmax(lm_head @ embed(t)), a function of t alone. repeat: embeddings and lm_head rows of
    unit length and equal, so that the next token is t itself."""
    if (dst / WEIGHTS).exists():
        return dst
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(WEIGHTS))
    w = load_file(src / WEIGHTS)
    _zero_layers(w)
    w["model.norm.weight"] = torch.ones_like(w["model.norm.weight"])
    if repeat:
        unit = torch.nn.functional.normalize(w["model.embed_tokens.weight"], dim=1)
        w["model.embed_tokens.weight"], w["lm_head.weight"] = unit, unit.clone()
    save_file(w, dst / WEIGHTS, metadata={"format": "pt"})
    return dst


def agreeing_head(target: Path, out: Path, eagle3: bool, noise: float = 0.0) -> Path:
    """A head that drafts what target (a bigram_target) decodes, all k tokens. EAGLE-1 (for a
    bigram target): fc passes on the embedding of the token after each position, through a layer
    that adds nothing, which the target's lm_head scores as the target would that token. EAGLE-3
    (for a repeating target): fc passes on layer 0's input (the embedding of the position's own
    token) and the draft vocabulary is the even tokens (d2t[d] = d), whose lm_head rows are the
    target's: a draft is right only through d2t. noise: Gaussian noise of that spread added to
    every weight, which makes the head agree in part."""
    make_head(target, out, eagle3)
    w = load_file(out / WEIGHTS)
    tw = load_file(target / WEIGHTS)
    _zero_layers(w)
    h = tw["model.embed_tokens.weight"].shape[1]
    if eagle3:
        w["fc.weight"] = torch.cat([torch.eye(h), torch.zeros(h, 2 * h)], dim=1)
        w["lm_head.weight"] = tw["lm_head.weight"][2 * w["d2t"]].clone()
    else:
        w["fc.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)
    g = torch.Generator().manual_seed(1)
    for name, tensor in w.items():
        if tensor.is_floating_point():
            w[name] = tensor + torch.randn(tensor.shape, generator=g) * noise
    save_file({k: v.contiguous() for k, v in w.items()}, out / WEIGHTS, metadata={"format": "pt"})
    return out
