"""From a structured-output request (kind, value) to an llguidance grammar, with the checks that
turn a bad schema, regex or grammar into a ValueError (HTTP 400 / INVALID_ARGUMENT) before any
worker sees it."""
from __future__ import annotations

import json
from functools import lru_cache

from llguidance import LLMatcher

KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")
# Compact JSON (OpenAI's own output shape): with flexible whitespace a weak model can spend its
# whole budget on blanks between tokens of an unfinished object.
JSON_OPTIONS = {"whitespace_flexible": False}
# What "any JSON object" means for json_object.
ANY_OBJECT = '{"type": "object"}'


def _lark_string(text: str) -> str:
    """A Lark string literal matching text exactly (llguidance reads JSON escapes in literals)."""
    return json.dumps(text, ensure_ascii=False)


def _choice_grammar(value: str) -> str:
    try:
        choices = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"structured_output choice must be a JSON list of strings: {e}") from None
    if not isinstance(choices, list) or not choices or not all(
            isinstance(c, str) and c for c in choices):
        raise ValueError("structured_output choice must be a non-empty list of non-empty strings")
    return LLMatcher.grammar_from_lark("start: " + " | ".join(_lark_string(c) for c in choices))


def _schema_grammar(schema: str) -> str:
    try:
        parsed = json.loads(schema)
    except json.JSONDecodeError as e:
        raise ValueError(f"structured_output json_schema is not valid JSON: {e}") from None
    if not isinstance(parsed, (dict, bool)):
        raise ValueError("structured_output json_schema must be a JSON object")
    return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)


@lru_cache(maxsize=256)
def grammar_of(kind: str, value: str) -> str:
    """The llguidance grammar (not yet checked) for one structured-output request; ValueError for
    bad input."""
    if kind == "json_object":
        return _schema_grammar(ANY_OBJECT)
    if kind == "json_schema":
        return _schema_grammar(value)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(value)
    if kind == "choice":
        return _choice_grammar(value)
    if kind == "grammar":
        return LLMatcher.grammar_from_lark(value)
    raise ValueError(f"structured_output kind must be one of {', '.join(KINDS)}; got {kind!r}")


@lru_cache(maxsize=256)
def check_structured(kind: str, value: str) -> None:
    """Raises ValueError (message starting "structured_output") when the request can never compile.

    Cached: a gateway sees the same few schemas over and over, and checking builds the grammar."""
    grammar = grammar_of(kind, value)
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise ValueError(f"structured_output invalid {kind}: {error.strip()}")
