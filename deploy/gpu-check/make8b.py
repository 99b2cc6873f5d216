"""A random Llama-3.1-8B-shaped checkpoint (bf16 safetensors, 128,256-token tokenizer) for the GPU
checks: the weights are initialised on the GPU (about 25 s there; 16 GB on disk).

    python3 deploy/gpu-check/make8b.py OUT_DIR

`build` takes the shape as keyword overrides so a CPU test can make a small one and keep this
script working between GPU sessions.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from baton.services.checkpoints.tiny_model import train_tokenizer

LLAMA_8B: dict[str, Any] = dict(
    vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=8192,
    rope_theta=500000.0, rms_norm_eps=1e-5,
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})


def build(out: Path, device: str = "cuda", **shape: Any) -> Path:
    """Writes the checkpoint to `out`; `shape` overrides LLAMA_8B's fields."""
    out.mkdir(parents=True, exist_ok=True)
    fields = LLAMA_8B | shape
    tokenizer = train_tokenizer(fields["vocab_size"])
    tokenizer.model_max_length = fields["max_position_embeddings"]
    eos = tokenizer.eos_token_id
    config = LlamaConfig(**fields, tie_word_embeddings=False, bos_token_id=None,
                         eos_token_id=eos, pad_token_id=eos, dtype="bfloat16",
                         initializer_range=0.02)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos,
                                               pad_token_id=eos)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


if __name__ == "__main__":
    started = time.time()
    written = build(Path(sys.argv[1]))
    print(f"wrote {sorted(p.name for p in written.iterdir())} in {time.time() - started:.1f} s")
