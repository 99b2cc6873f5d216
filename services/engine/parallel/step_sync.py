"""What rank 0 tells the other ranks each step: only what they cannot know.

Per scheduled sequence, in the step's packed order: a small handle, where this step's tokens start,
the tokens themselves (a decode step's one token, a prefill chunk's tokens), its draft when it
speculates (verified by the same multi-query forward on every rank), the change to its block table
since it was last sent (the blocks appended or the rejected positions' blocks trimmed, or the whole
table after a preemption rebuilt it) and its LoRA slot when that changed (the slots' contents
follow rank 0's LoRA manager on the same channel: lora/replicas.py); then the handles of finished
sequences, whose tables the ranks drop, the hidden rows rank 0 will score for prompt logprobs,
so that every rank joins the same lm_head gathers, and the decode bucket rank 0 replays, so that
every rank runs the same graph (cuda_graphs.py) or none.
Block tables are identical on all ranks because only rank 0 allocates blocks. Rejected draft
positions need no message of their own: their KV lies past the computed count rank 0 sends next,
so every rank overwrites it as the sequence goes on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from baton.services.engine.sequence import Sequence, Status


@dataclass
class SeqStep:
    handle: int
    num_computed: int
    tokens: list[int]
    keep_blocks: int  # of the table last sent, how many blocks stay
    new_blocks: list[int]  # appended after those
    samples: bool
    lora_slot: int | None = None  # the sequence's new LoRA slot (-1: none); None: unchanged
    draft: list[int] = field(default_factory=list)  # run after tokens, every position sampling


@dataclass
class StepMessage:
    seqs: list[SeqStep]
    dropped: list[int] = field(default_factory=list)
    score_rows: list[tuple[int, int]] = field(default_factory=list)
    bucket: int | None = None  # the decode graph bucket every rank replays; None: eager


@dataclass
class _Sent:
    seq: Sequence
    handle: int
    blocks: list[int]
    lora_slot: int = -1


class StepEncoder:
    """Rank 0's record of what the other ranks hold, turning a step into its StepMessage."""

    def __init__(self) -> None:
        self._sent: dict[int, _Sent] = {}  # by id(seq); the entry keeps seq alive
        self._next_handle = 0

    def encode(self, packed: list[Any], score_rows: list[tuple[int, int]],
               bucket: int | None = None) -> StepMessage:
        dropped = [s.handle for s in self._sent.values() if s.seq.status is Status.FINISHED]
        if dropped:
            self._sent = {k: s for k, s in self._sent.items()
                          if s.seq.status is not Status.FINISHED}
        return StepMessage([self._seq_step(item) for item in packed], dropped, score_rows, bucket)

    def _seq_step(self, item: Any) -> SeqStep:
        seq = item.seq
        sent = self._sent.get(id(seq))
        if sent is None:
            sent = self._sent[id(seq)] = _Sent(seq, self._next_handle, [])
            self._next_handle += 1
        blocks, old = seq.block_ids, sent.blocks
        # Blocks are appended as a sequence grows and trimmed after a rejected draft; anything else
        # (a preemption freed them) resends the table.
        common = min(len(old), len(blocks))
        keep = common if blocks[:common] == old[:common] else 0
        sent.blocks = list(blocks)
        slot = -1 if seq.lora_slot is None else seq.lora_slot
        changed = None if slot == sent.lora_slot else slot
        sent.lora_slot = slot
        first = seq.num_computed_tokens
        return SeqStep(sent.handle, first, seq.token_ids[first:first + item.num_tokens], keep,
                       blocks[keep:], item.samples, changed, list(item.draft))


class _Tokens:
    """A sequence's tokens as a rank other than 0 knows them: this step's, at their positions."""

    def __init__(self, first: int, tokens: list[int]) -> None:
        self.first, self.tokens = first, tokens

    def __getitem__(self, index: slice | int) -> list[int] | int:
        if isinstance(index, int):
            return self.tokens[index - self.first]
        return self.tokens[index.start - self.first:index.stop - self.first]


@dataclass
class MirrorSeq:
    num_computed_tokens: int
    token_ids: _Tokens
    block_ids: list[int]
    wants_prompt_logprobs: bool = False
    lora_slot: int | None = None


@dataclass
class MirrorItem:
    """A scheduled sequence as the model runner reads it (scheduler.ScheduledSeq's fields)."""
    seq: MirrorSeq
    num_tokens: int
    samples: bool
    draft: list[int] = field(default_factory=list)

    @property
    def num_positions(self) -> int:
        return self.num_tokens + len(self.draft)


class StepDecoder:
    """A rank's block tables and LoRA slots, kept in step with rank 0's by the messages."""

    def __init__(self) -> None:
        self.tables: dict[int, list[int]] = {}
        self.lora_slots: dict[int, int] = {}

    def decode(self, message: StepMessage) -> list[MirrorItem]:
        for handle in message.dropped:
            self.tables.pop(handle, None)
            self.lora_slots.pop(handle, None)
        items = []
        for s in message.seqs:
            table = self.tables.setdefault(s.handle, [])
            del table[s.keep_blocks:]
            table.extend(s.new_blocks)
            if s.lora_slot is not None:
                self.lora_slots[s.handle] = s.lora_slot
            slot = self.lora_slots.get(s.handle, -1)
            seq = MirrorSeq(s.num_computed, _Tokens(s.num_computed, s.tokens), table,
                            lora_slot=None if slot < 0 else slot)
            items.append(MirrorItem(seq, len(s.tokens), s.samples, s.draft))
        return items
