"""The copy jobs the engine thread hands the copy worker."""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

_ids = itertools.count()


@dataclass(frozen=True)
class TierHit:
    block_hash: int
    slot: int | None  # host slot (pinned until the load ends), or None: on disk


@dataclass(frozen=True)
class Store:
    block: int  # device block, kept from reuse until the copy ends
    block_hash: int


@dataclass
class Load:
    hits: list[TierHit]
    dst_blocks: list[int]  # device blocks, in prefix order
    id: int = field(default_factory=lambda: next(_ids))
    loaded: int = 0  # leading blocks in place when done: a failed disk read ends the prefix
    done: bool = False


@dataclass
class Flush:
    """Set once every job queued before it has been done (tests and benchmarks wait on it)."""
    done: threading.Event = field(default_factory=threading.Event)
