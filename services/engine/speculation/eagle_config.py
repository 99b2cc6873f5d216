"""An EAGLE head's config.json, checked against its target before anything loads: one layer of
the target's hidden size, the target's vocabulary (EAGLE-3: a draft vocabulary within it), and for
EAGLE-3 the three target layers it fuses."""
from __future__ import annotations

from pathlib import Path

from transformers import LlamaConfig, PretrainedConfig

from baton.services.engine.speculation.config import SpeculativeConfigError


def head_config(folder: Path, eagle3: bool, target: PretrainedConfig) -> LlamaConfig:
    """The head's config.json, checked against the target it drafts for."""
    path = folder / "config.json"
    if not path.is_file():
        raise SpeculativeConfigError(f"speculative config: EAGLE head {str(folder)!r} has no "
                                     "config.json")
    config = LlamaConfig.from_json_file(str(path))
    name = f"EAGLE head {str(folder)!r}"
    if config.hidden_size != target.hidden_size:
        raise SpeculativeConfigError(
            f"speculative config: {name} has hidden_size {config.hidden_size}, the target "
            f"{target.hidden_size}; a head is trained for one target model")
    if config.vocab_size != target.vocab_size:
        raise SpeculativeConfigError(
            f"speculative config: {name} has a vocabulary of {config.vocab_size} tokens, the "
            f"target {target.vocab_size}")
    if config.num_hidden_layers != 1:
        raise SpeculativeConfigError(
            f"speculative config: {name} has {config.num_hidden_layers} layers; EAGLE heads "
            "have one")
    if eagle3:
        draft_vocab = getattr(config, "draft_vocab_size", None) or config.vocab_size
        if not 0 < draft_vocab <= config.vocab_size:
            raise SpeculativeConfigError(
                f"speculative config: {name} has draft_vocab_size {draft_vocab}, not between 1 "
                f"and the target's {config.vocab_size}")
        config.draft_vocab_size = draft_vocab
    return config


def aux_layers(head: PretrainedConfig, target: PretrainedConfig) -> tuple[int, ...]:
    """The target layers whose inputs an EAGLE-3 head fuses: its config's
    eagle_aux_hidden_state_layer_ids (at the top or under eagle_config), else vLLM's default of
    (2, layers // 2, layers - 3)."""
    n = target.num_hidden_layers
    nested = getattr(head, "eagle_config", None) or {}
    ids = getattr(head, "eagle_aux_hidden_state_layer_ids", None)
    ids = ids or nested.get("eagle_aux_hidden_state_layer_ids") or (2, n // 2, n - 3)
    if len(ids) != 3 or any(not isinstance(i, int) or not 0 <= i < n for i in ids):
        raise SpeculativeConfigError(
            f"speculative config: an EAGLE-3 head fuses three of the target's {n} layers; got "
            f"{list(ids)} (set eagle_aux_hidden_state_layer_ids in the head's config.json)")
    return tuple(ids)
