"""The decode side of a KV hand-off looks in its own tiers before it pulls.

A reservation's prompt blocks that continue the device prefix cache's hits into the host tier or
disk are copied into the reserved blocks by the copy worker, as a colocated request's LOADING
prefix is; the pull then reads only the blocks after those. The engine thread never waits on the
copy: the decode worker asks whether it has landed (LLMEngine.prefilled_loaded). Reserved blocks
with a copy in flight are never freed before it ends (settle), or the copier would write into
blocks handed to another request.
"""
from __future__ import annotations

from baton.services.engine.kv.tiers.jobs import Load
from baton.services.engine.kv.tiers.manager import TierManager
from baton.services.engine.sequence import Sequence


class HandoffLoads:

    def __init__(self, tiers: TierManager | None, block_size: int, model_id: str) -> None:
        self.tiers = tiers
        self.block_size = block_size
        self.model_id = model_id
        self._jobs: dict[str, tuple[Load, int]] = {}  # request id -> (its load, device hits)

    def start(self, seq: Sequence, device_hits: int) -> int:
        """Queues the copy of the tier blocks continuing seq's device_hits leading cached blocks
        into its reserved blocks; returns how many blocks it copies (0: nothing to load). seq's
        blocks are all allocated already."""
        if self.tiers is None:
            return 0
        full = seq.num_prompt_tokens // self.block_size
        hashes = seq.full_block_hashes(self.block_size, self.model_id)[device_hits:full]
        hits = self.tiers.lookup(hashes) if hashes else []
        self.tiers.count(seq.num_prompt_tokens - device_hits * self.block_size, hits)
        if not hits:
            return 0
        job = self.tiers.load(hits, seq.block_ids[device_hits:device_hits + len(hits)])
        self._jobs[seq.request_id] = (job, device_hits)
        return len(hits)

    def loaded(self, request_id: str) -> int | None:
        """Leading blocks of the request's reservation in place once its copy has ended (device
        hits, then the tier blocks copied: a failed disk read ends them early); None while the copy
        is still running."""
        job, device_hits = self._jobs[request_id]
        with self.tiers.lock:
            if not job.done:
                return None
        self.settle(request_id)
        return device_hits + job.loaded

    def settle(self, request_id: str) -> None:
        """Waits out the request's copy, if any (its blocks are about to be freed or parked)."""
        entry = self._jobs.pop(request_id, None)
        if entry is not None:
            self.tiers.wait(entry[0])
