"""Bounds every server applies to what it accepts, whatever the model."""
from __future__ import annotations

# Far past any context: guards the worker and the router against absurd messages before any real
# check runs.
MAX_PROMPT_TOKENS = 1 << 20
