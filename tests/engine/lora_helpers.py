"""Shared by the LoRA tests: three PEFT adapters of different ranks and targets on a tiny model,
and the greedy continuations transformers + peft produce under each."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from baton.services.checkpoints.tiny_lora import ATTENTION, MLP, make_tiny_lora

# name -> (rank, targets, rsLoRA)
ADAPTERS = {
    "qv8": (8, ("q_proj", "v_proj"), False),
    "mlp4rs": (4, ("o_proj", "gate_proj", "down_proj"), True),
    "all16": (16, ATTENTION + MLP, False),
}
TIE_GAP = 1e-4


def make_adapters(model_dir: Path, root: Path) -> dict[str, Path]:
    return {name: make_tiny_lora(model_dir, root / name, rank, targets, seed=i + 1, rslora=rs)
            for i, (name, (rank, targets, rs)) in enumerate(ADAPTERS.items())}


def reference_model(model_dir: Path, adapter: Path | None) -> torch.nn.Module:
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    if adapter is None:
        return base
    from peft import PeftModel
    return PeftModel.from_pretrained(base, str(adapter)).eval()


@torch.no_grad()
def greedy_reference(model: torch.nn.Module, prompt: list[int],
                     new_tokens: int) -> tuple[list[int], list[float]]:
    """Greedy tokens (EOS ignored) and the top-2 logit gap at each step."""
    tokens, gaps = list(prompt), []
    for _ in range(new_tokens):
        logits = model(input_ids=torch.tensor([tokens])).logits[0, -1].float()
        top = logits.topk(2)
        gaps.append(float(top.values[0] - top.values[1]))
        tokens.append(int(top.indices[0]))
    return tokens[len(prompt):], gaps


def assert_matches(ours: list[int], want: list[int], gaps: list[float], what: str) -> None:
    """Equal token for token, except from a step where the reference itself nearly ties."""
    for i, (a, b) in enumerate(zip(ours, want)):
        if a != b:
            assert gaps[i] < TIE_GAP, f"{what}: token {i} is {a}, transformers+peft say {b}"
            return
    assert len(ours) == len(want), what
