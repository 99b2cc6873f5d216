"""What each tier counts (read by the metrics collector and the benchmark)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TierStats:
    queries: int = 0  # prompt tokens looked up in this tier (those the tiers above missed)
    hits: int = 0  # of those, tokens found here
    bytes_stored: int = 0
    seconds_stored: float = 0.0
    bytes_loaded: int = 0  # into device blocks
    seconds_loaded: float = 0.0
    blocks_stored: int = 0
    blocks_loaded: int = 0
    # disk: block files refused on read (deleted, never served); under tensor parallelism, blocks
    # whose share failed on any rank
    checksum_failures: int = 0
    write_errors: int = 0  # disk: writes that failed (the tier stops writing at the first)
