"""Structured outputs: JSON schemas, regexes, choices and Lark grammars enforced by token masks
(llguidance)."""
