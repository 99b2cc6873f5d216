"""A request's life across a KV hand-off, in one place.

In the batch a request is a Sequence that the Scheduler moves WAITING -> RUNNING -> FINISHED. A
disaggregated request also lives outside the batch, blocks taken but no step to run: HandoffTable
owns those sequences, and with them their blocks, on both ends.

Prefill worker (the engine holds the blocks; the worker's LeaseTable keeps only the lease's clock):

    PREFILLING --first token--> HELD (under a lease) --+--> PULLED   (decode worker's read notice)
        |                                             +--> RELEASED (UpdateLease, Abort, drain)
        | answer complete at prefill                  +--> EXPIRED  (the lease ran out)
        | (EOS, stop, max_tokens=1)                         each: release_kv, the blocks freed
        v
    FINISHED (blocks freed)

Decode worker:

    RESERVED --pull--> PULLING --ok--> COMMITTED (commit_prefilled) --> RUNNING --> FINISHED
       |                  |
       | no room          +--failed--> released; or PARKED while a late one-sided write may still
       v                               land (release_parked after the quarantine). The request is
    recomputed or failed               then recomputed under its own id, or failed, by policy.

A reservation whose prompt blocks continue from the decode worker's device prefix cache into its
own host or disk tier first loads those (still RESERVED, tiers/handoff_loads.py); the pull then
reads only the blocks after them.

HELD, RESERVED (PULLING is RESERVED while the worker reads) and PARKED are HandoffState; PREFILLING,
RUNNING and FINISHED are the Scheduler's.
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass
from typing import NamedTuple

import torch

from baton.services.engine.sequence import Sequence


class Reservation(NamedTuple):
    """The decode side's blocks for a prompt computed elsewhere: the first `cached` hold it already
    (the device prefix cache's), the `loading` after them are being copied in from its own KV tiers
    (LLMEngine.prefilled_loaded says when they have landed); the rest are to pull."""
    block_ids: list[int]
    cached: int
    loading: int = 0


@dataclass(frozen=True)
class HeldKV:
    """A held prompt's blocks as the prefill side hands them out: ids, full blocks' hashes, and
    with an EAGLE head, the target's row at the prompt's last position (float32; eagle.py)."""
    block_ids: list[int]
    block_hashes: list[int]
    head_row: torch.Tensor | None = None


class HandoffState(enum.Enum):
    HELD = "held"  # prefill side: finished, blocks kept for a pull
    RESERVED = "reserved"  # decode side: blocks taken while the prompt's KV arrives
    PARKED = "parked"  # decode side: a failed pull's blocks, unused while a late write may land


class HandoffTable:
    """The sequences whose blocks are taken outside the batch, by state. The engine frees what it
    takes back from here."""

    def __init__(self) -> None:
        self._held: dict[str, Sequence] = {}
        self._reserved: dict[str, Sequence] = {}
        self._parked: dict[int, Sequence] = {}
        self._tickets = itertools.count(1)

    def __len__(self) -> int:
        return len(self._held) + len(self._reserved) + len(self._parked)

    def state(self, request_id: str) -> HandoffState | None:
        """HELD or RESERVED for a request id; parked blocks belong to no request any more."""
        return (HandoffState.HELD if request_id in self._held else
                HandoffState.RESERVED if request_id in self._reserved else None)

    def hold(self, seq: Sequence) -> None:
        self._held[seq.request_id] = seq

    def held(self, request_id: str) -> Sequence | None:
        return self._held.get(request_id)

    def reserve(self, seq: Sequence) -> None:
        self._reserved[seq.request_id] = seq

    def take_reserved(self, request_id: str) -> Sequence:
        return self._reserved.pop(request_id)

    def park(self, request_id: str) -> int:
        """Moves a reservation out of its request's way; returns the ticket that releases it."""
        ticket = next(self._tickets)
        self._parked[ticket] = self._reserved.pop(request_id)
        return ticket

    def release(self, request_id: str) -> Sequence | None:
        """Ends a HELD or RESERVED hand-off; the caller frees the blocks."""
        return self._held.pop(request_id, None) or self._reserved.pop(request_id, None)

    def release_parked(self, ticket: int) -> Sequence | None:
        return self._parked.pop(ticket, None)
