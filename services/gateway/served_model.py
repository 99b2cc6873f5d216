"""The base models one gateway serves, each with its own tokenizer and chat template (the gateway
tokenizes and renders, so two models of different vocabularies cannot share them), its context
limit, vocabulary and tool-call format, and the LoRA adapters its workers serve. A request's
`model` names a base model or one of their adapters, and resolves to the base model that serves
it: the router places it only on that model's workers."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from baton.services.common.model_config import context_length, load_config
from baton.services.openai.tool_parsers import ToolParser, parser_for_model


@dataclass
class ServedModel:
    name: str  # what clients put in `model`
    path: str  # the checkpoint folder its tokenizer and template come from; `root` in /v1/models
    tokenizer: PreTrainedTokenizerBase
    max_model_len: int
    vocab_size: int | None = None  # logit_bias ids must fall in it
    tool_parser: ToolParser | None = None  # the family's tool-call format, for auto tool_choice
    # the LoRA adapters its workers serve (through the router's GetStats); their parent is this
    lora_adapters: frozenset[str] = frozenset()


def load_served_model(name: str, path: str, tool_call_parser: str,
                      max_model_len: int | None, strict_limit: bool = True) -> ServedModel:
    """The model's tokenizer, limit and vocabulary from its folder. `max_model_len` caps the
    limit; with `strict_limit` a cap above the model's own is an error (ValueError), otherwise
    the model's own limit wins (one cap given for models of different lengths)."""
    config = load_config(Path(path))
    tokenizer = AutoTokenizer.from_pretrained(path)
    own = context_length(config)
    limit = context_length(config, max_model_len) if strict_limit else min(
        own, max_model_len or own)
    return ServedModel(name, path, tokenizer, limit, config.vocab_size,
                       parser_for_model(tool_call_parser, config.model_type, tokenizer))


def parse_model_entry(entry: str) -> tuple[str, str]:
    """A NAME=PATH entry of --additional-models as (name, path); a bare PATH is named after its
    folder. ValueError for an empty name or path."""
    name, sep, path = entry.partition("=")
    if not sep:
        name, path = Path(entry).name, entry
    if not name or not path:
        raise ValueError(f"bad model entry {entry!r}: expected NAME=PATH")
    return name, path
