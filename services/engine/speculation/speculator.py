"""Speculation inside an engine step: drafts before the forward pass, verification after it, and
the KV of rejected positions given back.

A decode item gets a draft (from the n-gram proposer or a draft model, speculation/proposer.py) and
the blocks its positions need; the forward pass computes its last token and the draft in one chunk,
every position sampling. Verification keeps the accepted prefix and one token more, which go through
the output processor like any step's tokens; the sequence's computed count covers only what was
accepted, only blocks full of accepted tokens are hashed into the prefix cache, and the blocks only
rejected positions reached go back.

Every verified row is scored as plain decoding would score that position: penalties count the
draft tokens before it, logit bias applies to each, and a structured output's row j is masked by its
grammar after draft[:j] (drafts are cut where the grammar stops allowing them). A sequence with
min_tokens still pending or prompt logprobs, or whose seeded stream must stay one draw per token,
decodes without a draft; its output is unchanged either way.
"""
from __future__ import annotations

import torch

from baton.services.common.outputs import TokenLogprobs
from baton.services.engine.kv.block_manager import BlockManager
from baton.services.engine.sampler import (apply_logit_bias, filter_probs, penalize_row, sample,
                                           token_logprobs)
from baton.services.engine.scheduler import ScheduledSeq
from baton.services.engine.sequence import Sequence
from baton.services.engine.speculation.config import SpeculativeConfig
from baton.services.engine.speculation.proposer import Proposer
from baton.services.engine.speculation.rejection import rejection_sample, verify_greedy
from baton.services.engine.speculation.stats import SpecDecodeStats
from baton.services.engine.structured.drafts import allowed_prefix, draft_masks
from baton.services.engine.structured.masks import BatchMasks


def may_speculate(seq: Sequence) -> bool:
    """Whether seq may ever decode with a draft (see the module's docstring)."""
    p = seq.params
    return (not seq.hold_kv and seq.prompt_logprobs is None
            and (p.greedy or seq.generator is None))


def speculates(seq: Sequence) -> bool:
    """Whether seq may decode with a draft now."""
    return may_speculate(seq) and seq.num_output_tokens >= max(1, seq.params.min_tokens)


class Speculator:

    def __init__(self, config: SpeculativeConfig, proposer: Proposer, blocks: BlockManager,
                 max_model_len: int, max_num_batched_tokens: int, seed: int) -> None:
        self.config = config
        self.proposer = proposer
        self.blocks = blocks
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        # Its own CPU stream: verification draws on host copies of a few rows.
        self.generator = torch.Generator().manual_seed(seed)
        self.stats = SpecDecodeStats(accepted_per_pos=[0] * config.num_speculative_tokens)

    def propose(self, scheduled: list[ScheduledSeq]) -> None:
        """Gives each eligible decode item a draft and the blocks for it, within the step's token
        budget; a step above disable_by_batch_size sequences does not speculate."""
        cutoff = self.config.disable_by_batch_size
        if cutoff is not None and len(scheduled) > cutoff:
            return
        budget = self.max_num_batched_tokens - sum(s.num_tokens for s in scheduled)
        wanted = []
        for item in scheduled:
            seq = item.seq
            if budget <= 0:
                break
            if item.num_tokens != 1 or not item.samples or not speculates(seq):
                continue
            # The bonus token always comes: a draft never reaches past max_tokens or the context.
            room = min(self.config.num_speculative_tokens, budget,
                       seq.params.max_tokens - seq.num_output_tokens - 1,
                       self.max_model_len - seq.num_tokens)
            if room > 0:
                wanted.append((item, room))
                budget -= room
        for (item, _), draft in zip(wanted, self.proposer.draft(scheduled, wanted)):
            seq, tokens, probs = item.seq, draft.tokens, draft.probs
            if tokens and seq.grammar is not None:
                tokens = allowed_prefix(seq.grammar, tokens)
                probs = None if probs is None else probs[:len(tokens)]
            if tokens and self.blocks.can_grow(seq, seq.num_tokens + len(tokens)):
                self.blocks.grow(seq, seq.num_tokens + len(tokens))
                item.draft, item.draft_probs = tokens, probs

    def verify(self, items: list[ScheduledSeq], logits: torch.Tensor, generator: torch.Generator,
               eos_ids: frozenset[int], masks: BatchMasks | None
               ) -> tuple[list[list[int]], list[list[TokenLogprobs | None]]]:
        """Tokens (and logprobs) each item accepts: one for an item without a draft, sampled as
        without speculation; the verified prefix and one more for an item with one, whose KV then
        counts as computed (see _commit)."""
        starts, row = [], 0
        for item in items:
            starts.append(row)
            row += 1 + len(item.draft)
        tokens: list[list[int]] = [[] for _ in items]
        logprobs: list[list[TokenLogprobs | None]] = [[] for _ in items]
        plain = [i for i, item in enumerate(items) if not item.draft]
        if plain:
            rows = logits[torch.tensor([starts[i] for i in plain], device=logits.device)]
            got, lps = sample(rows, [items[i].seq for i in plain], generator, eos_ids, masks)
            for i, token, lp in zip(plain, got, lps):
                tokens[i], logprobs[i] = [token], [lp]
        for i, item in enumerate(items):
            if item.draft:
                rows = logits[starts[i]:starts[i] + 1 + len(item.draft)]
                tokens[i], logprobs[i] = self._verify(item, rows)
                self._commit(item.seq, tokens[i][:-1])
        return tokens, logprobs

    def _commit(self, seq: Sequence, accepted: list[int]) -> None:
        """The accepted draft positions' KV is the sequence's: computed, and its full blocks hashed
        into the prefix cache now, before the output processor appends the tokens and may finish
        the request (freeing the blocks) at a stop among them. Hashing reads token_ids, so the
        accepted tokens stand there for the while."""
        if not accepted:
            return
        old = seq.num_computed_tokens
        seq.token_ids += accepted
        seq.num_computed_tokens += len(accepted)
        self.blocks.cache_full_blocks(seq, old)
        del seq.token_ids[-len(accepted):]

    @torch.inference_mode()
    def _verify(self, item: ScheduledSeq,
                logits: torch.Tensor) -> tuple[list[int], list[TokenLogprobs | None]]:
        """logits: [len(draft) + 1, vocab], row j scoring the token after draft[:j]."""
        seq, draft = item.seq, item.draft
        p = seq.params
        raw = logits.log_softmax(dim=1) if p.logprobs is not None else None
        logits = self._scored(seq, draft, logits.clone())
        rows = [seq] * logits.shape[0]
        if p.greedy:
            out = verify_greedy(logits.argmax(dim=1).tolist(), draft)
        else:
            probs = filter_probs(logits, rows).to("cpu", torch.float64)
            out = rejection_sample(probs, draft, item.draft_probs, self.generator)
        self.stats.record(len(draft), len(out) - 1)
        if raw is None:
            return out, [None] * len(out)
        return out, [token_logprobs(raw[j], out[j], p.logprobs) for j in range(len(out))]

    @staticmethod
    def _scored(seq: Sequence, draft: list[int], logits: torch.Tensor) -> torch.Tensor:
        """The rows as the sampler would see each position: penalties over the tokens before it
        (the draft's included), logit bias, and the grammar's mask there."""
        p = seq.params
        if p.has_penalties:
            output = seq.output_token_ids
            for j in range(logits.shape[0]):
                penalize_row(logits[j], p, seq.token_ids + draft[:j], output + draft[:j])
        apply_logit_bias(logits, [seq] * logits.shape[0])
        if seq.grammar is not None:
            allowed = draft_masks(seq.grammar, draft, logits.shape[1]).to(logits.device)
            logits.masked_fill_(~allowed, float("-inf"))
        return logits

    def release_rejected(self, items: list[ScheduledSeq]) -> None:
        """After the output processor took the accepted tokens: the blocks that only rejected
        positions reached go back (a finished request gave back all of its own)."""
        for item in items:
            if item.draft and not item.seq.is_finished:
                self.blocks.trim(item.seq, item.seq.num_tokens)
