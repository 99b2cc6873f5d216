"""vLLM's `--speculative-config` JSON, parsed and checked up front.

Only what is built is accepted: the n-gram (prompt lookup) proposer, a draft model (`model`: a
checkpoint folder; vLLM's `method: "draft_model"`, or a `model` with no method) and EAGLE heads
(`method` "eagle" or "eagle3", `model`: the head's folder in its published format). vLLM's other
methods are refused by name, and so is every key this engine does not read, rather than ignored.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from transformers import PretrainedConfig

from baton.services.common.model_config import load_config

# Bounds on num_speculative_tokens: a verify step computes 1 + k positions per sequence.
MIN_SPECULATIVE_TOKENS, MAX_SPECULATIVE_TOKENS = 1, 16
KNOWN_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min",
              "prompt_lookup_max", "disable_by_batch_size")
# vLLM's other methods: named so that asking for one gets a clear refusal, not "unknown method".
UNBUILT_METHODS = ("medusa", "mlp_speculator", "mtp", "suffix")
# Methods whose model is a checkpoint folder: a draft model or an EAGLE head.
MODEL_METHODS = ("draft_model", "eagle", "eagle3")
# vLLM's default prompt lookup window when neither bound is given.
DEFAULT_PROMPT_LOOKUP = 5
NGRAM_NAMES = ("ngram", "[ngram]")
SUPPORTED = "supported: 'ngram', 'draft_model', 'eagle', 'eagle3'"


class SpeculativeConfigError(ValueError):
    """The speculative config cannot be served; the message says which key and why."""


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    # method ngram's window of suffix lengths (0 for a draft model)
    prompt_lookup_min: int
    prompt_lookup_max: int
    # A step with more running sequences than this does not speculate (None: always speculates).
    disable_by_batch_size: int | None = None
    # methods draft_model, eagle and eagle3: the draft's or the head's checkpoint folder
    model: str | None = None


def _int(raw: dict, key: str, low: int, high: int | None = None) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpeculativeConfigError(f"speculative config: {key} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"between {low} and {high}"
        raise SpeculativeConfigError(f"speculative config: {key} must be {bound}, got {value}")
    return value


def _method(raw: dict) -> str:
    method, model = raw.get("method"), raw.get("model")
    if method is None and model is not None:
        # vLLM's older spelling: the method given as the model, else the model is a draft
        method = "ngram" if model in NGRAM_NAMES else "draft_model"
    if method in UNBUILT_METHODS:
        raise SpeculativeConfigError(
            f"speculative config: method {method!r} is not supported by this engine yet; "
            f"{SUPPORTED}")
    if method in MODEL_METHODS:
        return method
    if method not in NGRAM_NAMES:
        raise SpeculativeConfigError(
            f"speculative config: unknown method {method!r}; {SUPPORTED}")
    if model not in (None, *NGRAM_NAMES):
        raise SpeculativeConfigError(
            f"speculative config: method 'ngram' takes no draft model, got model {model!r}")
    return "ngram"


def _draft_model(raw: dict, method: str) -> str:
    """The draft's (or head's) folder, which must be a checkpoint folder."""
    model = raw.get("model")
    what = "draft model" if method == "draft_model" else f"{method} head"
    if not model or not isinstance(model, str):
        raise SpeculativeConfigError(
            f"speculative config: method {method!r} needs model, the {what}'s checkpoint folder")
    if not (Path(model) / "config.json").is_file():
        raise SpeculativeConfigError(
            f"speculative config: {what} {model!r} is not a checkpoint folder (no "
            "config.json there)")
    for key in ("prompt_lookup_min", "prompt_lookup_max"):
        if key in raw:
            raise SpeculativeConfigError(
                f"speculative config: {key} applies to method 'ngram' only")
    return model


def check_draft_vocab(config: SpeculativeConfig, target: PretrainedConfig) -> None:
    """A draft proposes token ids of the target's vocabulary: the two must have the same size; an
    EAGLE head must also have the target's hidden size (speculation/eagle_config.py)."""
    if config.method in ("eagle", "eagle3"):
        # Imported here: eagle_config reads this module's error.
        from baton.services.engine.speculation.eagle_config import aux_layers, head_config
        head = head_config(Path(config.model), config.method == "eagle3", target)
        if config.method == "eagle3":
            aux_layers(head, target)
        return
    if config.model is None:
        return
    try:
        draft_vocab = load_config(config.model).vocab_size
    except (OSError, ValueError) as e:
        raise SpeculativeConfigError(
            f"speculative config: draft model {config.model!r} cannot be served: {e}") from None
    if draft_vocab != target.vocab_size:
        raise SpeculativeConfigError(
            f"speculative config: draft model {config.model!r} has a vocabulary of "
            f"{draft_vocab} tokens, the target {target.vocab_size}; a draft must share the "
            "target's tokenizer and vocabulary")


def parse_speculative_config(text: str | dict | None) -> SpeculativeConfig | None:
    """The config from its JSON (or an already parsed dict); None when unset or empty. Raises
    SpeculativeConfigError naming the offending key."""
    if text is None or text == "" or text == {}:
        return None
    if isinstance(text, str):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise SpeculativeConfigError(f"speculative config is not valid JSON: {e}") from None
    else:
        raw = text
    if not isinstance(raw, dict):
        raise SpeculativeConfigError("speculative config must be a JSON object")
    unknown = sorted(set(raw) - set(KNOWN_KEYS))
    if unknown:
        raise SpeculativeConfigError(
            f"speculative config: unknown or unsupported keys {unknown}; accepted: "
            f"{list(KNOWN_KEYS)}")
    method = _method(raw)
    k = _int(raw, "num_speculative_tokens", MIN_SPECULATIVE_TOKENS, MAX_SPECULATIVE_TOKENS)
    if k is None:
        raise SpeculativeConfigError(
            "speculative config: num_speculative_tokens is required (between "
            f"{MIN_SPECULATIVE_TOKENS} and {MAX_SPECULATIVE_TOKENS})")
    cutoff = _int(raw, "disable_by_batch_size", 1)
    if method in MODEL_METHODS:
        return SpeculativeConfig(method, k, 0, 0, cutoff, _draft_model(raw, method))
    low, high = _int(raw, "prompt_lookup_min", 1), _int(raw, "prompt_lookup_max", 1)
    low, high = (low or high or DEFAULT_PROMPT_LOOKUP), (high or low or DEFAULT_PROMPT_LOOKUP)
    if low > high:
        raise SpeculativeConfigError(
            f"speculative config: prompt_lookup_min ({low}) is above prompt_lookup_max ({high})")
    return SpeculativeConfig(method, k, low, high, cutoff)
