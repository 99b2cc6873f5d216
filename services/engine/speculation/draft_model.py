"""The draft-model proposer: a second, smaller checkpoint of the target's vocabulary drafts each
sequence's next tokens, one forward pass per token, over a paged KV cache of its own.

The draft's cache has the target's blocks (as many, of the same size), so a sequence's block table
addresses both and the draft's KV lives and goes with the target's blocks: allocated, trimmed after
a rejection and freed with them. The draft only writes a sequence's own positions: its prompt and
accepted tokens, and the draft tokens past them.

How far the draft's KV holds a sequence (DraftKV) is checked against the sequence each step: it is
good through the tokens it was computed for that the sequence still has, so the KV of rejected
draft tokens is rolled back by counting it out, to be overwritten later. What the sequence gained
meanwhile (accepted and bonus tokens, steps above disable_by_batch_size, a prompt whose KV came by
hand-off to this decode worker) is caught up in the step's first draft pass, together with the
prompt chunks the target computes in the step. A preempted sequence starts over, and so does one
admitted on prefix-cache hits: the draft did not necessarily compute those blocks.

Under tensor parallelism the draft is neither sharded nor replicated: rank 0 runs it whole on its
own device, and only its tokens reach the other ranks (in the step's message, for the verify pass
that runs on all of them). A draft is small: sharded, it would wait on a collective per layer per
draft token; replicated, every rank would spend memory and compute on tokens only rank 0 needs. Its
cache has the target's block ids, so it lives and goes with rank 0's blocks as at TP=1.

A request with a LoRA adapter is drafted by the base draft (DraftView has no adapter slot) and
verified by the target under its adapter, so its output is the adapter's; the adapter only lowers
the acceptance rate as far as it moves the target away from what the draft predicts.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from weakref import WeakKeyDictionary

import torch

from baton.services.common.model_config import context_length, load_config
from baton.services.engine.config import EngineConfig
from baton.services.engine.kv.block_manager import BlockManager
from baton.services.engine.kv.kv_cache import KVCacheTooLarge
from baton.services.engine.model_runner import ModelRunner
from baton.services.engine.parallel.state import solo
from baton.services.engine.sampler import apply_logit_bias, filter_probs
from baton.services.engine.scheduler import ScheduledSeq
from baton.services.engine.sequence import Sequence
from baton.services.engine.speculation.config import SpeculativeConfig, SpeculativeConfigError
from baton.services.engine.speculation.proposer import Draft
from baton.services.engine.speculation.speculator import may_speculate

log = logging.getLogger(__name__)


@dataclass
class DraftKV:
    computed: int  # leading tokens of the sequence the draft's KV was computed for
    pending: list[int]  # draft tokens whose KV was written at the positions after those
    preemptions: int  # the sequence's count then: a preemption takes its blocks away

    def valid(self, seq: Sequence) -> int:
        """Leading tokens of seq the draft's KV holds now."""
        if seq.num_preemptions != self.preemptions:
            return 0
        held = self.computed
        for written, token in zip(self.pending, seq.token_ids[self.computed:]):
            if written != token:
                break
            held += 1
        return held


@dataclass
class DraftView:
    """A sequence as the draft's model runner reads it: its tokens with the draft so far, how many
    of them the draft's KV holds, and the target's block table."""
    token_ids: list[int]
    num_computed_tokens: int
    block_ids: list[int]
    lora_slot: None = None
    wants_prompt_logprobs: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class DraftModelProposer:

    def __init__(self, runner: ModelRunner, blocks: BlockManager, max_model_len: int,
                 seed: int) -> None:
        """runner: the draft's, with as many blocks as the target's cache; max_model_len: the
        longest sequence the draft can score (at most the target's)."""
        self.runner = runner
        self.blocks = blocks
        self.max_model_len = max_model_len
        # Sampled drafts draw on the host, from their own stream.
        self.generator = torch.Generator().manual_seed(seed)
        # Keyed by the sequence itself: an entry goes when its sequence does.
        self.kv: WeakKeyDictionary[Sequence, DraftKV] = WeakKeyDictionary()

    @torch.inference_mode()
    def draft(self, step: list[ScheduledSeq],
              wanted: list[tuple[ScheduledSeq, int]]) -> list[Draft]:
        rooms = {id(item): self._room(item.seq, room) for item, room in wanted}
        views, logits = self._catch_up(step, rooms)
        tokens: dict[int, list[int]] = {id(item): [] for item, _ in wanted}
        probs: dict[int, list[torch.Tensor]] = {id(item): [] for item, _ in wanted}
        active = [item for item, _ in wanted if rooms[id(item)] > 0]
        while active:
            self._pick(active, logits, tokens, probs)
            active = [item for item in active if len(tokens[id(item)]) < rooms[id(item)]]
            if active:
                logits = self._advance([(id(item), views[id(item)], tokens[id(item)][-1])
                                        for item in active])
        drafts = []
        for item, _ in wanted:
            got, drawn_from = tokens[id(item)], probs[id(item)]
            if got:
                # The last draft token is never run through the draft: its KV is not written.
                self.kv[item.seq] = DraftKV(item.seq.num_tokens, got[:-1],
                                            item.seq.num_preemptions)
            drafts.append(Draft(got, torch.stack(drawn_from) if drawn_from else None))
        return drafts

    def _room(self, seq: Sequence, room: int) -> int:
        """The draft's length for seq: within the draft's context, and 0 unless the blocks for its
        positions can be had (taken here: the draft writes into them before verification)."""
        room = min(room, self.max_model_len - seq.num_tokens)
        if room <= 0 or not self.blocks.can_grow(seq, seq.num_tokens + room):
            return 0
        self.blocks.grow(seq, seq.num_tokens + room)
        return room

    def _catch_up(self, step: list[ScheduledSeq], rooms: dict[int, int]
                  ) -> tuple[dict[int, ScheduledSeq], dict[int, torch.Tensor]]:
        """The step's first draft pass: every sequence's KV brought up to what the target holds
        after the step; for one that drafts, up to its last token, whose logits give the first
        draft token. Returns the pass's item and logits of each sequence that drafts, by the id
        of its step item."""
        batch, views = [], {}
        for item in step:
            seq = item.seq
            drafting = rooms.get(id(item), 0) > 0
            end = seq.num_computed_tokens + item.num_tokens
            if not drafting and (not may_speculate(seq) or end > self.max_model_len):
                continue
            state = self.kv.get(seq)
            start = 0 if state is None else state.valid(seq)
            if drafting:
                # Never all held (accepted tokens are always followed by one the draft did not
                # write); were it so, rewriting the last position is harmless.
                start = min(start, end - 1)
            elif start >= end:
                continue
            else:
                self.kv[seq] = DraftKV(end, [], seq.num_preemptions)
            view = ScheduledSeq(DraftView(seq.token_ids[:end], start, seq.block_ids), end - start)
            batch.append((id(item), view))
            if drafting:
                views[id(item)] = view
        return views, self._forward(batch)

    def _forward(self, batch: list[tuple[int, ScheduledSeq]]) -> dict[int, torch.Tensor]:
        """One draft pass over batch's (key, item) pairs: each item's logits row by its key."""
        if not batch:
            return {}
        key = {id(view): k for k, view in batch}
        items, logits = self.runner.execute([view for _, view in batch])
        return {key[id(view)]: logits[row] for row, view in enumerate(items)}

    def _pick(self, active: list[ScheduledSeq], logits: dict[int, torch.Tensor],
              tokens: dict[int, list[int]], probs: dict[int, list[torch.Tensor]]) -> None:
        """Each active sequence's next draft token from the last pass's logits: the argmax for a
        greedy request, else a draw from the request's filtered distribution, which is kept for the
        rejection sampler."""
        seqs = [item.seq for item in active]
        rows = torch.stack([logits[id(item)] for item in active]).float()
        apply_logit_bias(rows, seqs)
        chosen = rows.argmax(dim=1).tolist()
        sampled = [i for i, seq in enumerate(seqs) if not seq.params.greedy]
        if sampled:
            dists = filter_probs(rows[sampled], [seqs[i] for i in sampled]).to("cpu", torch.float64)
            for dist, i in zip(dists, sampled):
                chosen[i] = int(torch.multinomial(dist, 1, generator=self.generator))
                probs[id(active[i])].append(dist)
        for item, token in zip(active, chosen):
            tokens[id(item)].append(token)

    def _advance(self, active: list[tuple[int, ScheduledSeq, int]]) -> dict[int, torch.Tensor]:
        """A pass over each (key, draft-pass item, newest draft token): that token's KV written,
        and the logits of the one after, by key."""
        for _, view, token in active:
            view.seq.num_computed_tokens = view.seq.num_tokens
            view.seq.token_ids.append(token)
            view.num_tokens = 1
        return self._forward([(key, view) for key, view, _ in active])


def build_draft_proposer(engine: EngineConfig, spec: SpeculativeConfig, blocks: BlockManager,
                         dtype: torch.dtype, device: torch.device,
                         max_model_len: int) -> DraftModelProposer:
    """The draft's model and cache, beside the target's (its dtype and device, as many blocks);
    raises SpeculativeConfigError when its cache does not fit."""
    config = load_config(spec.model)
    # The draft's rotary tables and graphs are sized to the longest sequence it scores.
    max_len = min(context_length(config), max_model_len)
    # Under tensor parallelism the draft runs whole on rank 0 alone (see the module's docstring).
    settings = engine.model_copy(update={"model": spec.model, "num_kv_blocks": blocks.num_blocks,
                                         "kv_cache_memory_gib": None, "speculative_config": None,
                                         "tensor_parallel_size": 1, "enable_lora": False,
                                         "lora_modules": []})
    try:
        with solo():
            runner = ModelRunner(settings, config, Path(spec.model), dtype, device, max_len)
    except KVCacheTooLarge as e:
        # The target's cache was sized from memory without it: say how to make room for both.
        raise SpeculativeConfigError(
            f"speculative config: the draft model's KV cache ({blocks.num_blocks} blocks, as many "
            f"as the target's) does not fit beside the target's; set --num-kv-blocks or "
            f"--kv-cache-memory-gib so that both fit ({e})") from None
    log.info("draft model %s: %d KV blocks beside the target's, %d positions", spec.model,
             runner.num_blocks, max_len)
    return DraftModelProposer(runner, blocks, max_len, engine.seed)
