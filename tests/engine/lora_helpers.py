"""Shared by the LoRA tests: three PEFT adapters of different ranks and targets on a tiny model,
and the greedy continuations transformers + peft produce under each."""
from __future__ import annotations

import json
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


def make_bad_adapters(model_dirs: dict[str, Path], root: Path,
                      max_rank: int = 16) -> dict[str, tuple[Path, str]]:
    """Adapters the llama model cannot serve, each with (a pattern of) the error naming why: a rank
    above `max_rank`, a target module it lacks, the shapes of another base model, a truncated and a
    corrupt safetensors file."""
    llama = model_dirs["llama"]
    cases = {
        "rank": (make_tiny_lora(llama, root / "rank", max_rank * 2, ("q_proj",), seed=1),
                 f"rank {max_rank * 2} is above --max-lora-rank {max_rank}"),
        "targets": (make_tiny_lora(llama, root / "targets", 4, ("q_proj",), seed=2),
                    r"target modules \['c_attn'\]"),
        "other-model": (make_tiny_lora(model_dirs["qwen3"], root / "other", 4, ("q_proj",), seed=3),
                        "another model"),
        "truncated": (make_tiny_lora(llama, root / "truncated", 4, ("q_proj",), seed=4),
                      "corrupt or truncated"),
        "corrupt": (make_tiny_lora(llama, root / "corrupt", 4, ("q_proj",), seed=5),
                    "corrupt or truncated"),
    }
    config = cases["targets"][0] / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()),
                                  "target_modules": ["q_proj", "c_attn"]}))
    truncated = cases["truncated"][0] / "adapter_model.safetensors"
    truncated.write_bytes(truncated.read_bytes()[:truncated.stat().st_size // 2])
    (cases["corrupt"][0] / "adapter_model.safetensors").write_bytes(b"\x07not safetensors" * 64)
    return cases
