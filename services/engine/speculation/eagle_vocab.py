"""The target's token embedding and lm_head as an EAGLE head reads them (eagle.py).

At TP=1 they are the target's own layers. Under tensor parallelism the target's are split by
vocabulary over the ranks, so a lookup or a score is a collective that every rank must join, while
the head runs on rank 0 alone (eagle.py's docstring): rank 0 then reads the whole tables from the
target's checkpoint itself. The embedding stays in host memory, since a pass looks up only a few
rows, which are copied over; it takes nothing of the device. The lm_head, which scores every
EAGLE-1 draft position, is a device copy (vocab x hidden: 0.98 GiB for Llama-3 8B, 1.96 GiB for
70B in bf16), counted in the head's footprint (footprint.py) so that the KV cache leaves it room.
An EAGLE-3 head scores with its own lm_head and needs none of the target's.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import PretrainedConfig

from baton.services.engine.models.llama import LlamaForCausalLM
from baton.services.engine.models.loader import checkpoint_files
from baton.services.engine.speculation.config import SpeculativeConfigError

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


@dataclass
class TargetVocab:
    embed: Callable[[torch.Tensor], torch.Tensor]  # token ids -> [tokens, hidden]
    # [rows, hidden] -> float32 [rows, vocab]; None for an EAGLE-3 head, which has its own.
    logits: Callable[[torch.Tensor], torch.Tensor] | None


def lm_head_bytes(config: PretrainedConfig, dtype: torch.dtype) -> int:
    """What rank 0's copy of the target's lm_head takes of its device."""
    return config.vocab_size * config.hidden_size * (torch.finfo(dtype).bits // 8)


def shared_vocab(target: LlamaForCausalLM) -> TargetVocab:
    """The target's own layers (a group of one: no collective)."""
    return TargetVocab(target.model.embed_tokens, target.compute_logits)


def whole_vocab(model_dir: Path, config: PretrainedConfig, eagle3: bool, dtype: torch.dtype,
                device: torch.device) -> TargetVocab:
    """Whole tables read from the target's checkpoint, for a head that runs on rank 0 alone."""
    embedding = _read(model_dir, EMBEDDING).to(dtype)
    if eagle3:
        return TargetVocab(_lookup(embedding), None)
    tied = getattr(config, "tie_word_embeddings", False)
    head = (embedding if tied else _read(model_dir, LM_HEAD).to(dtype)).to(device)
    # Tied tables: the device copy serves the lookups too.
    return TargetVocab(_lookup(head if tied else embedding),
                       lambda hidden: F.linear(hidden, head).float())


def _lookup(table: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    def embed(ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids.to(table.device), table).to(ids.device)
    return embed


def _read(model_dir: Path, name: str) -> torch.Tensor:
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            if name in f.keys():
                return f.get_tensor(name)
    raise SpeculativeConfigError(
        f"speculative config: the EAGLE head runs on rank 0 alone at --tensor-parallel-size > 1 "
        f"and reads the target's {name} itself, which {str(model_dir)!r} lacks")
