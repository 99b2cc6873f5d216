"""A small checkpoint that copies: a tiny Llama trained briefly on random token spans repeated, so
that it continues a repeat as an LLM continues a quoted passage (what prompt lookup feeds on).

Random-weight checkpoints never repeat their context, so on them an n-gram proposer's drafts are
all rejected; `baton bench spec` needs a model whose outputs do repeat, and none can be downloaded
here. Two layers learn an induction head (attend to the token after the previous occurrence of the
current one) within a few hundred steps when the loss counts only the copied positions: the first
occurrence of a span is random and teaches nothing. The recipe is deterministic (seeded data and
init), and `cached_copy_model` trains it once per recipe into the temp dir.
`python -m baton.loadtest.bench.copy_model DIR` writes one.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from baton.services.checkpoints.tiny_model import TinyModelSpec, make_tiny_model

SPEC = dict(hidden_size=128, num_layers=2, num_heads=4, num_kv_heads=4, head_dim=32,
            intermediate_size=256, initializer_range=0.02)
# Ids below this are the tokenizer's special and byte tokens: spans use merged tokens only.
FIRST_TOKEN = 300
IGNORE = -100  # labels the loss skips


@dataclass(frozen=True)
class Recipe:
    max_steps: int = 1000
    # Training stops at the first step whose batch is copied this well (greedy, copied positions).
    target_accuracy: float = 0.97
    batch: int = 32
    # The bench's prompt + output (160): every position it decodes at was trained.
    length: int = 160
    lr: float = 2e-3
    seed: int = 0


def repeat_batch(batch: int, length: int, vocab: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row: a random span of 8-32 tokens then copies of it, cut to `length` tokens; and the
    labels, IGNORE over the first occurrence."""
    rows, labels = [], []
    for _ in range(batch):
        span = int(torch.randint(8, 33, (1,), generator=generator))
        tokens = torch.randint(FIRST_TOKEN, vocab, (span,), generator=generator)
        row = tokens.repeat(-(-length // span))[:length]
        label = row.clone()
        label[:span] = IGNORE
        rows.append(row)
        labels.append(label)
    return torch.stack(rows), torch.stack(labels)


def copy_accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Greedy next-token accuracy over the copied positions."""
    target = labels[:, 1:]
    counted = target != IGNORE
    return (logits[:, :-1].argmax(-1)[counted] == target[counted]).float().mean().item()


def train_copy_model(out_dir: Path, recipe: Recipe = Recipe()) -> float:
    """Writes the checkpoint to out_dir (tokenizer and config from make_tiny_model); returns the
    last step's copy accuracy. Seeded, so the same recipe stops at the same step."""
    torch.manual_seed(recipe.seed)
    make_tiny_model(out_dir, TinyModelSpec(**SPEC, seed=recipe.seed))
    model = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(recipe.seed)
    model.train()
    accuracy = 0.0
    for step in range(recipe.max_steps):
        ids, labels = repeat_batch(recipe.batch, recipe.length, model.config.vocab_size, generator)
        out = model(input_ids=ids, labels=labels)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        accuracy = copy_accuracy(out.logits.detach(), labels)
        done = accuracy >= recipe.target_accuracy
        if step % 50 == 0 or done:
            print(f"step {step}: loss {out.loss.item():.3f}, copy accuracy {accuracy:.1%}",
                  flush=True)
        if done:
            break
    model.eval()
    model.save_pretrained(out_dir)
    return accuracy


def cached_copy_model(recipe: Recipe = Recipe(), root: Path | None = None) -> Path:
    """The checkpoint for this recipe, trained on first use into root (default: the temp dir) and
    reused after; written to a scratch folder and renamed, so an interrupted run leaves none."""
    key = hashlib.sha256(json.dumps([SPEC, asdict(recipe)]).encode()).hexdigest()[:12]
    root = root or Path(tempfile.gettempdir()) / "baton-copy-model"
    target = root / key
    if not (target / "model.safetensors").exists():
        root.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=root, prefix=f".{key}-"))
        try:
            train_copy_model(scratch, recipe)
            scratch.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--max-steps", type=int, default=Recipe.max_steps)
    args = parser.parse_args()
    train_copy_model(args.out_dir, Recipe(max_steps=args.max_steps))


if __name__ == "__main__":
    main()
