"""The EAGLE proposer (vLLM's methods "eagle" and "eagle3"): a one-layer head (eagle_head.py)
drafts each sequence's next tokens from the target's hidden states, chained k times over a paged
KV cache of its own.

The target's model runner hands over each forward pass's hidden states (capture_hidden). The head
pairs position j's hidden state with the token after it, so a row can only be used once that
token is known, after verification: rows are kept per sequence until the next draft (or, in a
step that does not speculate, the next forward pass), when the head runs over the positions that
were accepted ("catching up"); its output at the sequence's last computed position gives the first
draft token, and each draft token, paired with the head's own output before it, the next.

The head's cache has the target's blocks (as many, of the same size), so a sequence's block table
addresses both and the head's KV lives and goes with the target's blocks, as a draft model's does.
Its KV at the draft tokens' positions is rewritten by the next catch-up, which starts where the
previous step's rows start. The KV tiers (kv/tiers) store and load the head's blocks with the
target's, so a prefix or swapped-out sequence that comes back from host memory or disk has its
head KV too. Positions whose hidden states this worker never computed (prefix-cache hits on blocks
the head did not fill, a prompt handed off by a prefill worker without the same head) and the
positions of a finished request's last step (its rows are never caught up: a later prefix hit on
those blocks reads what the physical block held before) keep what their blocks hold: the drafts
there may be worse, the outputs are the same (verification keeps them exact).

A KV hand-off carries the head's KV with the target's. The prefill worker, running the same head,
keeps its prompt's rows too and, once the first token is sampled, runs the head over the whole
prompt (hand_off), so the head's cache holds the prompt's KV in the prompt's blocks; the transport
moves those blocks of both caches. The target's row at the prompt's last position goes with the
handle (the decode side's first draft pairs it with the first token, which the prefill worker
sampled): the decode worker keeps it as if it had computed it (handed_off), and drafts in its first
step exactly as a colocated engine does.

Under tensor parallelism the head runs whole on rank 0 alone, as a draft model does: the hidden
states it reads are rank 0's full rows (the residual stream is whole on every rank after each
all-reduce, EAGLE-3's layer inputs too), and only its tokens reach the other ranks, in the step's
message. It needs the target's embedding and (EAGLE-1) lm_head whole, which rank 0 reads from the
checkpoint itself (eagle_vocab.py: the embedding in host memory, the lm_head on the device). The
other way, the head sharded over every rank in lockstep, was weighed for Llama-3 8B and 70B
(vocabulary 128256, hidden 4096 / 8192, 8 KV heads; bf16; k draft positions take k head passes):
- Memory. Whole on rank 0: the head (EAGLE-1 0.47 / 1.84 GiB, EAGLE-3 with its 32K-token lm_head
  0.79 / 2.61 GiB), EAGLE-1's lm_head copy (0.98 / 1.96 GiB) and 4 KiB of head KV per token
  beside the target's 128 / 320 KiB / TP. Every rank has the fewest blocks any rank fits, so all
  lose what rank 0 spends: 70B at TP=8 with EAGLE-1, about 15% of the KV blocks (3.8 GiB of a
  ~54 GiB cache, and 4 of 44 KiB a token); 8B at TP=2, about 8%. Sharded: 1/TP of the head
  and of its KV, no copy; 70B at TP=8 about 2%.
- Collectives. Whole on rank 0: none. Sharded: per head pass, the embedding's, o_proj's and
  down_proj's all-reduces ([tokens, hidden]), a gather of the logits to rank 0 (EAGLE-1: 0.5 MB
  a sequence in float32) and a message to the other ranks with the batch and the tokens rank 0
  just picked, which must reach them before the next pass; the other ranks would also keep the
  hidden rows and mirror the proposer's catch-up bookkeeping.
- Time. A draft pass is bound by its weight reads: whole, rank 0 reads the head and lm_head alone
  (70B EAGLE-1: 3.8 GiB, ~1.2 ms a pass on an H100) while the others wait; sharded, 1/TP of that
  plus the five collectives' latencies.
Whole on rank 0 is taken: the followers and their messages stay as they are, no pass waits on a
slow rank, and at TP=2 (8B's usual shape) the sharded head would save ~0.2 ms a pass and ~5% of
the blocks at the price of a second step protocol. At 70B over 8 ranks the sharded head's lower
memory and per-pass time are worth that protocol; it is the next step (docs/architecture.md).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from weakref import WeakKeyDictionary

import torch

from baton.services.common.model_config import head_dim
from baton.services.engine.config import EngineConfig
from baton.services.engine.kv import kv_cache
from baton.services.engine.kv.block_manager import BlockManager
from baton.services.engine.kv.kv_cache import KVCacheTooLarge
from baton.services.engine.layers.attention import Attention
from baton.services.engine.layers.rotary import RotaryEmbedding
from baton.services.engine.model_runner import ModelRunner, decode_batch
from baton.services.engine.parallel.state import solo
from baton.services.engine.scheduler import ScheduledSeq
from baton.services.engine.sequence import Sequence
from baton.services.engine.speculation.config import SpeculativeConfig, SpeculativeConfigError
from baton.services.engine.speculation.draft_model import DraftModelProposer, DraftView
from baton.services.engine.speculation.eagle_config import aux_layers, head_config
from baton.services.engine.speculation.eagle_graphs import HeadGraphs, head_graphs
from baton.services.engine.speculation.eagle_head import EagleHead, load_head
from baton.services.engine.speculation.eagle_vocab import TargetVocab, shared_vocab, whole_vocab
from baton.services.engine.speculation.proposer import Draft
from baton.services.engine.speculation.speculator import may_speculate

log = logging.getLogger(__name__)


@dataclass
class Rows:
    first: int  # the position of rows[0]
    rows: torch.Tensor  # [positions, hidden (* 3 for EAGLE-3)]: the target's, from one pass
    preemptions: int  # the sequence's count then: a preemption takes its blocks away


@dataclass
class Pass:
    """One head pass's result for a sequence: its item (to chain on), its logits row over the
    target's vocabulary and its hidden state for the next position."""
    view: ScheduledSeq
    logits: torch.Tensor
    hidden: torch.Tensor


class HeadRunner(ModelRunner):
    """The head and its one-layer cache beside the target's; steps are prepared as the target's
    are (the inherited _prepare), the head reads the target's embedding and lm_head (vocab)."""

    def __init__(self, engine: EngineConfig, head: EagleHead, vocab: TargetVocab,
                 vocab_size: int, num_blocks: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.device, self.block_size, self.lora = device, engine.block_size, None
        self.executor = self.encoder = self.graphs = self.verify_graphs = self.hidden_sink = None
        self.head_graphs: HeadGraphs | None = None  # build_eagle_proposer's
        self.head, self.vocab, self.attention = head, vocab, head.layer.self_attn.attention
        self.vocab_size = vocab_size
        self.num_blocks = num_blocks
        config = head.config
        self.attention.kv_cache = kv_cache.allocate(config, num_blocks, engine.block_size, dtype,
                                                    device, config.num_key_value_heads,
                                                    engine.kv_cache_layout)
        self.block_bytes = kv_cache.block_bytes(config, engine.block_size, dtype,
                                                config.num_key_value_heads)

    @torch.inference_mode()
    def run(self, batch: list[tuple[ScheduledSeq, torch.Tensor]]) -> dict[int, Pass]:
        """One pass over (item, hidden rows of its positions) pairs; each item's Pass at its last
        position, by id(item)."""
        if not batch:
            return {}
        bucket = self._head_bucket(batch)
        if bucket is not None:
            return self._replay_head(batch, bucket)
        # _prepare packs multi-position items first, as the attention expects.
        batch = sorted(batch, key=lambda pair: pair[0].num_positions == 1)
        packed = [item for item, _ in batch]
        ids, positions, meta, last = self._prepare(packed)
        hidden = torch.cat([rows for _, rows in batch]).to(self.device)
        out, nxt = self.head(self.vocab.embed(ids), hidden, positions, meta)
        return self._passes(packed, out[last], nxt[last])

    def _passes(self, packed: list[ScheduledSeq], out: torch.Tensor,
                nxt: torch.Tensor) -> dict[int, Pass]:
        if self.head.eagle3:
            logits = self.head.draft_logits(out, self.vocab_size)
        else:
            logits = self.vocab.logits(out)
        return {id(item): Pass(item, logits[i], nxt[i]) for i, item in enumerate(packed)}

    def _head_bucket(self, batch: list[tuple[ScheduledSeq, torch.Tensor]]) -> int | None:
        """The graph bucket of a chained pass (one position an item, each paired with the head's
        own hidden state), or None: eager."""
        graphs = self.head_graphs
        if graphs is None or any(item.num_positions != 1 or rows.shape[-1] != graphs.hidden_size
                                 for item, rows in batch):
            return None
        return graphs.bucket_for(len(batch))

    def _replay_head(self, batch: list[tuple[ScheduledSeq, torch.Tensor]],
                     bucket: int) -> dict[int, Pass]:
        """A chained pass through the head's graph buffers (eagle_graphs.py)."""
        packed = [item for item, _ in batch]
        graphs, rows = self.head_graphs, len(batch)
        step = decode_batch(packed, self.block_size)
        ids = torch.tensor(step.token_ids, device=self.device)
        graphs.inputs.embeds[:rows].copy_(self.vocab.embed(ids))
        graphs.inputs.hidden[:rows].copy_(torch.cat([h for _, h in batch]).to(self.device))
        out = graphs.run(step, bucket)
        width = graphs.hidden_size
        if out.shape[-1] == width:  # EAGLE-1: one result
            return self._passes(packed, out, out.clone())
        return self._passes(packed, out[:, :width], out[:, width:].clone())


def keeps_rows(seq: Sequence) -> bool:
    """Whether the head computes seq's KV: one that may draft, or a prompt held for a hand-off
    (the decode side drafts after it)."""
    return may_speculate(seq) or seq.hold_kv


class EagleProposer(DraftModelProposer):
    """Drafts as the draft-model proposer does (its rooms and picks), from the head's passes."""

    def __init__(self, runner: HeadRunner, blocks: BlockManager, max_model_len: int,
                 seed: int) -> None:
        super().__init__(runner, blocks, max_model_len, seed)
        self.rows: WeakKeyDictionary[Sequence, Rows] = WeakKeyDictionary()
        # Prefill side: each held prompt's last target row, for its hand-off.
        self.last_rows: WeakKeyDictionary[Sequence, torch.Tensor] = WeakKeyDictionary()

    @property
    def row_width(self) -> int:
        """The width of the target's rows the head reads (3 * hidden for EAGLE-3)."""
        head = self.runner.head
        return head.config.hidden_size * (3 if head.eagle3 else 1)

    @torch.inference_mode()
    def hand_off(self, seq: Sequence) -> None:
        """Prefill side: a held prompt's first token is known, so the head runs over the rows
        still kept (all of the prompt's, or its last chunk's) and its cache holds the prompt's KV;
        the last row is kept for the handle."""
        kept = self.rows.pop(seq, None)
        end = seq.num_computed_tokens
        if (kept is None or seq.num_preemptions != kept.preemptions
                or kept.first + len(kept.rows) != end or end >= seq.num_tokens):
            return
        view = ScheduledSeq(DraftView(seq.token_ids[1:end + 1], kept.first, seq.block_ids),
                            end - kept.first)
        self.runner.run([(view, kept.rows)])
        self.last_rows[seq] = kept.rows[-1].float().cpu()

    def handed_off(self, seq: Sequence, row: torch.Tensor) -> bool:
        """Decode side: seq's prompt KV, the head's with it, came from a prefill worker, with the
        target's row at its last position, kept here as this worker's own would be. False (and
        nothing kept) for a row of another width."""
        if row.shape != (self.row_width,):
            return False
        if may_speculate(seq):
            dtype = self.runner.attention.kv_cache.dtype
            self.rows[seq] = Rows(seq.num_computed_tokens - 1, row.to(dtype)[None],
                                  seq.num_preemptions)
        return True

    def observe(self, packed: list[ScheduledSeq], hidden: torch.Tensor) -> None:
        """The target runner's hidden-state sink: rows a draft did not use yet are used now,
        before this pass's are kept."""
        self._catch_up()
        start = 0
        for item in packed:
            n = item.num_positions
            if keeps_rows(item.seq):
                self.rows[item.seq] = Rows(item.seq.num_computed_tokens, hidden[start:start + n],
                                           item.seq.num_preemptions)
            start += n

    def _catch_up(self) -> dict[int, Pass]:
        """The head over every kept row whose following token is known now (the accepted ones);
        the Pass of each sequence so brought up to its last computed position, by id(seq)."""
        batch, seqs = [], {}
        for seq, kept in list(self.rows.items()):
            del self.rows[seq]
            end = min(kept.first + len(kept.rows), seq.num_computed_tokens, seq.num_tokens - 1)
            if seq.is_finished or seq.num_preemptions != kept.preemptions or end <= kept.first:
                continue
            view = ScheduledSeq(DraftView(seq.token_ids[1:end + 1], kept.first, seq.block_ids),
                                end - kept.first)
            batch.append((view, kept.rows[:end - kept.first]))
            if end == seq.num_computed_tokens:
                seqs[id(view)] = seq
        return {id(seqs[key]): done for key, done in self.runner.run(batch).items()
                if key in seqs}

    @torch.inference_mode()
    def draft(self, step: list[ScheduledSeq],
              wanted: list[tuple[ScheduledSeq, int]]) -> list[Draft]:
        passes = self._catch_up()
        # Only a sequence the head caught up with drafts (not one whose rows it never saw).
        rooms = {id(item): self._room(item.seq, room) if id(item.seq) in passes else 0
                 for item, room in wanted}
        tokens: dict[int, list[int]] = {id(item): [] for item, _ in wanted}
        probs: dict[int, list[torch.Tensor]] = {id(item): [] for item, _ in wanted}
        active = [item for item, _ in wanted if rooms[id(item)] > 0]
        last = {id(item): passes[id(item.seq)] for item in active}
        while active:
            self._pick(active, {key: p.logits for key, p in last.items()}, tokens, probs)
            active = [item for item in active if len(tokens[id(item)]) < rooms[id(item)]]
            if active:
                last = self._chain(active, last, tokens)
        return [Draft(tokens[id(item)], torch.stack(probs[id(item)]) if probs[id(item)] else None)
                for item, _ in wanted]

    def _chain(self, active: list[ScheduledSeq], last: dict[int, Pass],
               tokens: dict[int, list[int]]) -> dict[int, Pass]:
        """The head at the next position of each active item: its newest draft token with the
        head's own hidden state before it."""
        batch, keys = [], {}
        for item in active:
            done = last[id(item)]
            view = done.view
            view.seq.num_computed_tokens = view.seq.num_tokens
            view.seq.token_ids.append(tokens[id(item)][-1])
            view.num_tokens = 1
            batch.append((view, done.hidden[None]))
            keys[id(view)] = id(item)
        return {keys[key]: done for key, done in self.runner.run(batch).items()}


def build_eagle_proposer(engine: EngineConfig, spec: SpeculativeConfig, blocks: BlockManager,
                         target: ModelRunner, dtype: torch.dtype,
                         max_model_len: int) -> EagleProposer:
    """The head and its cache beside the target's (its dtype and device, as many blocks), and the
    target's runner set to hand it hidden states. Raises SpeculativeConfigError for a head that
    does not fit the target or whose cache does not fit beside the target's."""
    eagle3 = spec.method == "eagle3"
    folder, model = Path(spec.model), target.model
    config = head_config(folder, eagle3, model.config)
    layers = aux_layers(config, model.config) if eagle3 else None
    # Before the cache's check: rank 0's lm_head copy (eagle_vocab.py) is on the device.
    vocab = shared_vocab(model) if engine.tensor_parallel_size == 1 else whole_vocab(
        Path(engine.model), model.config, eagle3, dtype, target.device)
    settings = engine.model_copy(update={"num_kv_blocks": blocks.num_blocks,
                                         "kv_cache_memory_gib": None})
    try:
        kv_cache.num_blocks(settings, config, dtype, target.device, max_model_len)
    except KVCacheTooLarge as e:
        raise SpeculativeConfigError(
            f"speculative config: the EAGLE head's KV cache ({blocks.num_blocks} blocks, as many "
            "as the target's) does not fit beside the target's; set --num-kv-blocks or "
            f"--kv-cache-memory-gib so that both fit ({e})") from None
    attention = Attention(head_dim(config) ** -0.5, target.attention.backend, engine.block_size)
    # Whole on rank 0 under tensor parallelism: its layers join no collective.
    with solo():
        head = load_head(folder, config, attention, eagle3, dtype, target.device)
    head.config = config
    head.rope = RotaryEmbedding(config, head_dim(config), max_model_len).to(target.device)
    runner = HeadRunner(engine, head, vocab, model.config.vocab_size, blocks.num_blocks, dtype,
                        target.device)
    max_batch = min(engine.cuda_graph_max_batch_size, engine.max_num_seqs,
                    spec.disable_by_batch_size or engine.max_num_seqs)
    runner.head_graphs = head_graphs(head, engine, max_batch, max_model_len, dtype,
                                     target.device)
    proposer = EagleProposer(runner, blocks, max_model_len, engine.seed)
    target.capture_hidden(layers, proposer.observe)
    log.info("%s head %s: %d KV blocks beside the target's%s", spec.method, spec.model,
             blocks.num_blocks, f", fusing layers {list(layers)}" if layers else "")
    return proposer
