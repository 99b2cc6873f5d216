"""Iteration-level continuous batching under one token budget per step.

Each step first advances running sequences (decodes, then unfinished prefill chunks), preempting by
recompute (or swap) when blocks run out, then admits waiting sequences, highest priority first and
FCFS within a priority. A waiting sequence whose LoRA adapter has no device slot yet (every slot
held by running sequences, or its weights still on their way from disk) stays waiting and is passed
over, so the sequences behind it, of resident adapters or the base model, still run.

With KV tiers (kv/tiers), a waiting sequence whose prefix continues past the device cache into the
host or disk tier is admitted into a loading state: blocks are allocated for that part and the copy
worker fills them while other sequences run; once loaded it joins the running batch and computes
only the rest. Swap preemption copies a victim's full blocks to the host tier (a block manager
free with offload) and its resume looks there; recompute drops them.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from baton.services.engine.kv.block_manager import BlockManager
from baton.services.engine.kv.tiers.jobs import Load, TierHit
from baton.services.engine.kv.tiers.manager import TierManager
from baton.services.engine.lora.manager import LoRAManager
from baton.services.engine.lora.modules import LoRAError
from baton.services.engine.sequence import Sequence, Status


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # tokens computed this step, starting at seq.num_computed_tokens
    # Speculative decoding: proposed tokens run after the last one, each position sampling; they
    # are not the sequence's until verified (speculation/speculator.py).
    draft: list[int] = field(default_factory=list)

    @property
    def num_positions(self) -> int:
        """Positions this step runs through the model for the item: its tokens and its draft."""
        return self.num_tokens + len(self.draft)

    @property
    def samples(self) -> bool:
        """Whether this step reaches the end of the known tokens, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens


@dataclass
class SchedulerStats:
    prefix_cache_queries: int = 0  # prompt tokens looked up
    prefix_cache_hits: int = 0  # of those, tokens found cached
    preemptions: int = 0
    preemptions_swapped: int = 0  # of those, with the victim's blocks kept in the host tier


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_batched_tokens: int, max_num_seqs: int,
                 enable_chunked_prefill: bool = True, tiers: TierManager | None = None,
                 swap: bool = False, lora: LoRAManager | None = None) -> None:
        self.blocks = block_manager
        self.tiers = tiers
        self.swap = swap and tiers is not None
        self.loading: dict[int, Sequence] = {}  # Load.id -> its sequence
        self.loading_jobs: dict[int, Load] = {}
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: list[Sequence] = []  # kept sorted by Sequence.sort_key
        self.running: list[Sequence] = []
        self.stats = SchedulerStats()
        self.lora = lora
        # Waiting sequences whose adapter could not be read: the engine ends them after schedule().
        self.failed: list[tuple[Sequence, str]] = []

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        bisect.insort(self.waiting, seq, key=Sequence.sort_key)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.loading)

    def add_running(self, seq: Sequence) -> None:
        """Joins a sequence whose KV is already in place (a hand-off's receiver) straight into the
        batch."""
        seq.status = Status.RUNNING
        self.running.append(seq)

    def remove(self, seq: Sequence, free_blocks: bool = True) -> None:
        """Takes a sequence out of the queues (finished or aborted) and, unless told not to, frees
        its blocks."""
        if seq.status == Status.RUNNING:
            self.running.remove(seq)
        elif seq.status == Status.WAITING:
            self.waiting.remove(seq)
        elif seq.status == Status.LOADING:
            # Its blocks are being written: they go back only once the copy is done.
            job_id = next(j for j, s in self.loading.items() if s is seq)
            self.tiers.wait(self.loading_jobs.pop(job_id))
            del self.loading[job_id]
        if free_blocks:
            self.blocks.free(seq)
        if self.lora is not None:
            self.lora.release(seq)
        seq.status = Status.FINISHED

    def prefill_tokens_queued(self) -> int:
        """Prompt tokens admitted but not yet computed: the prefill work ahead of a new request."""
        waiting = sum(s.num_tokens - s.num_computed_tokens for s in self.waiting)
        return waiting + sum(
            r for s in self.running if (r := s.num_tokens - s.num_computed_tokens) > 1)

    def schedule(self) -> list[ScheduledSeq]:
        self._finish_loads()
        scheduled = self._schedule()
        if not scheduled and self.loading:
            # Nothing to run until a load lands: wait for one rather than spin.
            self.tiers.wait_for_load(0.05)
            self._finish_loads()
            scheduled = self._schedule()
        return scheduled

    def _schedule(self) -> list[ScheduledSeq]:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted = self._schedule_running(scheduled, budget)
        budget -= sum(s.num_tokens for s in scheduled)
        if not preempted:
            self._schedule_waiting(scheduled, budget)
        return scheduled

    def _schedule_running(self, scheduled: list[ScheduledSeq], budget: int) -> bool:
        """Serves running sequences, decodes before prefill chunks (each best-first), so a long
        prompt's chunk never takes the budget from streams already generating. Victims of preemption
        come from the tail of the running list and are never sequences already scheduled this
        step."""
        self.running.sort(key=Sequence.sort_key)
        order = sorted(self.running, key=lambda s: s.num_tokens - s.num_computed_tokens > 1)
        taken: set[int] = set()
        preempted = False
        for seq in order:
            if budget <= 0:
                break
            if seq.status != Status.RUNNING:  # preempted earlier in this step
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.blocks.can_grow(
                    seq, seq.num_computed_tokens + n) and seq.status == Status.RUNNING:
                self._preempt(next(s for s in reversed(self.running) if id(s) not in taken))
                preempted = True
            if seq.status != Status.RUNNING:
                continue
            self.blocks.grow(seq, seq.num_computed_tokens + n)
            scheduled.append(ScheduledSeq(seq, n))
            taken.add(id(seq))
            budget -= n
        return preempted

    def _lora_ready(self, seq: Sequence) -> bool:
        """Whether seq's adapter (if any) holds a device slot for it now."""
        if self.lora is None:
            return True
        try:
            return self.lora.acquire(seq)
        except LoRAError as e:
            self.failed.append((seq, str(e)))
            return False

    def waiting_loras(self) -> set[str]:
        return {s.lora_name for s in self.waiting if s.lora_name is not None}

    def running_loras(self) -> set[str]:
        return {s.lora_name for s in self.running if s.lora_name is not None}

    def _schedule_waiting(self, scheduled: list[ScheduledSeq], budget: int) -> None:
        i = 0
        while (i < len(self.waiting) and budget > 0
               and len(self.running) + len(self.loading) < self.max_num_seqs):
            seq = self.waiting[i]
            # Prompt logprobs need every prompt position's logits: see prompt_logprobs.py.
            hits = [] if seq.wants_prompt_logprobs else self.blocks.cached_prefix(seq)
            tier_hits = self._tier_lookup(seq, len(hits))
            if tier_hits is not None:
                admitted = self._admit_loading(seq, i, hits, tier_hits)
                if admitted is None:
                    break
                i += int(not admitted)
                continue
            remaining = seq.num_tokens - len(hits) * self.blocks.block_size
            n = min(remaining, budget)
            if n < remaining and not self.enable_chunked_prefill:
                break
            if not self.blocks.can_admit(hits, len(hits) * self.blocks.block_size + n):
                break
            if not self._lora_ready(seq):
                i += 1
                continue
            self.waiting.pop(i)
            self._count_hits(seq, hits, [])
            self.blocks.admit(seq, hits)
            self.blocks.grow(seq, seq.num_computed_tokens + n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSeq(seq, n))
            budget -= n

    def _count_hits(self, seq: Sequence, hits: list[int], tier_hits: list[TierHit]) -> None:
        """A first admission's prefix-cache figures: device hits, and the tiers' lookups."""
        if seq.num_preemptions:
            return
        bs = self.blocks.block_size
        self.stats.prefix_cache_queries += seq.num_prompt_tokens
        self.stats.prefix_cache_hits += len(hits) * bs
        seq.num_cached_tokens = len(hits) * bs
        if self.tiers is not None and not seq.wants_prompt_logprobs:
            self.tiers.count(seq.num_prompt_tokens - len(hits) * bs, tier_hits)

    def _tier_lookup(self, seq: Sequence, device_hits: int) -> list[TierHit] | None:
        """The tier blocks continuing seq's device-cache prefix (host slots pinned), or None when
        there are none to load: no tiers, prompt logprobs wanted, or a recompute-preempted
        sequence."""
        if (self.tiers is None or seq.wants_prompt_logprobs
                or (seq.num_preemptions and not self.swap)):
            return None
        hashes = seq.full_block_hashes(self.blocks.block_size, self.blocks.model_id)
        limit = (seq.num_tokens - 1) // self.blocks.block_size
        found = self.tiers.lookup(hashes[device_hits:limit]) if device_hits < limit else []
        return found or None

    def _admit_loading(self, seq: Sequence, index: int, hits: list[int],
                       tier_hits: list[TierHit]) -> bool | None:
        """Admits seq (waiting[index]) into the loading state: its device hits pinned, blocks
        allocated for its tier hits and their copy queued. Nothing is taken when the blocks do not
        fit now (None: admission stops) or its adapter has no slot yet (False: passed over)."""
        bs = self.blocks.block_size
        end = len(hits) + len(tier_hits)
        if not self.blocks.can_admit(hits, end * bs):
            self.tiers.release(tier_hits)
            return None
        if not self._lora_ready(seq):
            self.tiers.release(tier_hits)
            return False
        self.waiting.pop(index)
        self._count_hits(seq, hits, tier_hits)
        self.blocks.admit(seq, hits)
        self.blocks.grow(seq, end * bs)
        seq.status = Status.LOADING
        job = self.tiers.load(tier_hits, seq.block_ids[len(hits):end])
        self.loading[job.id] = seq
        self.loading_jobs[job.id] = job
        return True

    def _finish_loads(self) -> None:
        """Sequences whose tier blocks have landed join the running batch; blocks a failed disk
        read left empty are computed like any others."""
        if self.tiers is None:
            return
        for job in self.tiers.poll():
            seq = self.loading.pop(job.id, None)
            if seq is None:  # a hand-off reservation's load (tiers/handoff_loads.py)
                continue
            del self.loading_jobs[job.id]
            old = seq.num_computed_tokens
            seq.num_computed_tokens = old + job.loaded * self.blocks.block_size
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
            self.blocks.cache_full_blocks(seq, old)
            seq.status = Status.RUNNING
            self.running.append(seq)

    def _preempt(self, seq: Sequence) -> None:
        """Preemption: drop the KV and requeue. Its cached blocks stay hittable on the device; by
        swap they also go to the host tier, and its resume loads them from there."""
        self.running.remove(seq)
        self.blocks.free(seq, offload=self.swap)
        if self.lora is not None:
            self.lora.release(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.stats.preemptions += 1
        self.stats.preemptions_swapped += int(self.swap)
        self.add(seq)

    def finish_step(self, scheduled: list[ScheduledSeq]) -> None:
        """Advances computed-token counts after the model ran and registers newly full blocks."""
        for item in scheduled:
            seq = item.seq
            old = seq.num_computed_tokens
            seq.num_computed_tokens += item.num_tokens
            self.blocks.cache_full_blocks(seq, old)
