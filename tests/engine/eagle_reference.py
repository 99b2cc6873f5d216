"""A float64 reference for an EAGLE head's greedy drafts, written from the published formats'
arithmetic without Baton's code: the target's hidden states from transformers, then the head over
every position from scratch (no cache), chained k times."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

F64 = torch.float64


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x: [positions, heads, head_dim] at positions 0.. (transformers' rotate-half layout)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=F64) / d)
    ang = torch.arange(x.shape[0], dtype=F64)[:, None] * inv
    cos, sin = torch.cat((ang, ang), -1).cos()[:, None], torch.cat((ang, ang), -1).sin()[:, None]
    half = torch.cat((-x[..., d // 2:], x[..., :d // 2]), -1)
    return x * cos + half * sin


def _attention(x: torch.Tensor, w: dict, p: str, cfg: dict) -> torch.Tensor:
    n, hd = x.shape[0], cfg["head_dim"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    q = _rope((x @ w[p + "q_proj.weight"].T).view(n, heads, hd), cfg["rope_theta"])
    k = _rope((x @ w[p + "k_proj.weight"].T).view(n, kv, hd), cfg["rope_theta"])
    v = (x @ w[p + "v_proj.weight"].T).view(n, kv, hd)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * hd ** -0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(n, heads * hd)
    return out @ w[p + "o_proj.weight"].T


def _mlp(x: torch.Tensor, w: dict, p: str) -> torch.Tensor:
    gate, up = x @ w[p + "gate_proj.weight"].T, x @ w[p + "up_proj.weight"].T
    return (torch.nn.functional.silu(gate) * up) @ w[p + "down_proj.weight"].T


class EagleReference:

    def __init__(self, target: Path, head: Path, eagle3: bool) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(str(target), torch_dtype=F64).eval()
        self.cfg = json.loads((head / "config.json").read_text())
        self.w = {k: v.to(F64) if v.is_floating_point() else v
                  for k, v in load_file(head / "model.safetensors").items()}
        self.eagle3 = eagle3

    def _head(self, tokens: list[int], hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Position j reads tokens[j] (the token after it) and hidden[j]; returns (target-vocab
        logits, the head's hidden state) at the last position."""
        w, cfg, eps = self.w, self.cfg, self.cfg["rms_norm_eps"]
        emb = self.model.get_input_embeddings().weight[torch.tensor(tokens)]
        if not self.eagle3:
            x = torch.cat((emb, hidden), -1) @ w["fc.weight"].T
            r = x + _attention(x, w, "layers.0.self_attn.", cfg)
            out = r + _mlp(_rms(r, w["layers.0.post_attention_layernorm.weight"], eps), w,
                           "layers.0.mlp.")
            return self.model.lm_head.weight @ out[-1], out[-1]
        p = "midlayer."
        x = torch.cat((_rms(emb, w[p + "input_layernorm.weight"], eps),
                       _rms(hidden, w[p + "hidden_norm.weight"], eps)), -1)
        r = hidden + _attention(x, w, p + "self_attn.", cfg)
        pre = r + _mlp(_rms(r, w[p + "post_attention_layernorm.weight"], eps), w, p + "mlp.")
        draft = w["lm_head.weight"] @ _rms(pre[-1], w["norm.weight"], eps)
        full = torch.full((cfg["vocab_size"],), float("-inf"), dtype=F64)
        full[torch.arange(len(w["d2t"])) + w["d2t"]] = draft
        return full, pre[-1]

    @torch.no_grad()
    def drafts(self, context: list[int], k: int) -> list[int]:
        """k greedy draft tokens after context (whose last token the target has not computed)."""
        out = self.model(torch.tensor([context[:-1]]), output_hidden_states=True)
        if self.eagle3:
            layers = self.cfg["eagle_aux_hidden_state_layer_ids"]
            rows = torch.cat([out.hidden_states[i][0] for i in layers], -1) @ self.w["fc.weight"].T
        else:
            rows = out.hidden_states[-1][0]
        tokens, drafted = list(context[1:]), []
        for _ in range(k):
            logits, nxt = self._head(tokens, rows)
            drafted.append(int(logits.argmax()))
            tokens.append(drafted[-1])
            rows = torch.cat((rows, nxt[None]))
        return drafted
