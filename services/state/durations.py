"""Durations as operators write them: '90' or '90s', '15m', '12h', '7d'."""
from __future__ import annotations

import re

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str) -> float:
    """Seconds; ValueError naming the accepted forms."""
    match = _DURATION.match(str(text))
    if match is None:
        raise ValueError(f"not a duration: {text!r} (expected e.g. 90, 90s, 15m, 12h, 7d)")
    return float(match.group(1)) * _UNITS[match.group(2)]
