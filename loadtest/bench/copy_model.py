"""A small checkpoint that copies: a tiny Llama trained briefly on random token spans repeated, so
that it continues a repeat as an LLM continues a quoted passage (what prompt lookup feeds on).

Random-weight checkpoints never repeat their context, so on them an n-gram proposer's drafts are
all rejected; `baton bench spec` needs a model whose outputs do repeat, and none can be downloaded
here. `python -m baton.loadtest.bench.copy_model DIR` writes one (a few minutes on a CPU).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from baton.services.checkpoints.tiny_model import TinyModelSpec, make_tiny_model

SPEC = dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=32,
            intermediate_size=256, initializer_range=0.02)
# Ids below this are the tokenizer's special and byte tokens: spans use merged tokens only.
FIRST_TOKEN = 300


def repeat_batch(batch: int, length: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """Each row: a random span then copies of it (span lengths vary), cut to `length` tokens."""
    rows = []
    for _ in range(batch):
        span = int(torch.randint(4, length // 4, (1,), generator=generator))
        tokens = torch.randint(FIRST_TOKEN, vocab, (span,), generator=generator)
        rows.append(tokens.repeat(-(-length // span))[:length])
    return torch.stack(rows)


def train_copy_model(out_dir: Path, steps: int = 2000, batch: int = 16, length: int = 64,
                     seed: int = 0) -> Path:
    """Writes the checkpoint to out_dir (tokenizer and config from make_tiny_model)."""
    make_tiny_model(out_dir, TinyModelSpec(**SPEC, seed=seed))
    model = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    generator = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    model.train()
    for step in range(steps):
        ids = repeat_batch(batch, length, vocab, generator)
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)
    model.eval()
    model.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    train_copy_model(args.out_dir, args.steps)


if __name__ == "__main__":
    main()
