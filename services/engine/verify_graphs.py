"""CUDA graphs for speculative verify steps.

A verify step runs each decode item's last token and its draft as one short chunk over its cached
context (speculation/speculator.py). Speculation pays off mostly at small batch, where an eager
step's kernel launches, not the GPU, set the pace; so a step whose items are all decode items with
a draft of at most k tokens (k = num_speculative_tokens) replays a graph of bucket x (1 + k) token
rows, one graph per batch bucket, as decode steps do (cuda_graphs.py, whose machinery this reuses:
buckets, lockstep capture, LoRA variants, enforce_eager running the same buffers without a graph).

Every item is a chunk of exactly 1 + k rows. An item whose draft is shorter (cut by max_tokens, the
context length or a grammar, or an n-gram proposer that found fewer tokens, or none) is padded with
dummy rows that write nothing (slot -1) and whose logits are never read; padding items (bucket rows
past the batch) are dummy rows only. The attention is the chunked-prefill kernel
(kernels/paged_prefill_attention.py): with every chunk 1 + k long its query start offsets are
constant per bucket and its grid (tokens // BLOCK_M + chunks) is fixed, and it reads each chunk's
context length on the device. A chunk's context length counts its dummy rows too, so its real rows
sit at their true positions; causal masking keeps the dummies out of the real rows' view, and the
dummies' own reads past the sequence's blocks stay inside the block-table buffer, which is k
positions wider than the longest sequence for that (its stale entries are valid block ids). The
dummies' position ids (for the rotary embedding only) are 0, within every table.

Logits stay outside the graph, as for decode steps: the lm_head runs on the real rows only. Under
tensor parallelism rank 0's step message names the bucket; a step whose items carry drafts replays
the verify graph of that bucket on every rank (the followers see the drafts in the message), any
other the decode graph. An EAGLE head's sink of final hidden states is handed the real rows (a
copy); an EAGLE-3 head's, which reads layer inputs the graphs do not keep, runs steps eagerly.
Captured only with speculation on, after the decode graphs, into their memory pool and within what
is left of their capture time limit, up to the decode graphs' token count (see verify_graphs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from baton.services.engine.cuda_graphs import (CAPTURE_TIME_LIMIT_S, DecodeGraphs, Forward,
                                               buffer_pair, row_adapters)
from baton.services.engine.layers.attention import AttentionMetadata
from baton.services.engine.speculation.config import SpeculativeConfig

if TYPE_CHECKING:
    from baton.services.engine.lora.weights import LoRAState


@dataclass
class VerifyBatch:
    """One verify step's inputs, a row per item."""
    token_ids: list[list[int]]  # the item's last token, then its draft
    first_positions: list[int]  # the position of each row's first token (its computed count)
    block_tables: list[list[int]]
    # Each row's LoRA slot (-1: the base model); None when no row has an adapter.
    adapters: list[int] | None = None


class VerifyInputs:
    """The verify graphs' persistent buffers: width = 1 + k token rows per item."""

    def __init__(self, max_batch: int, width: int, max_model_len: int, block_size: int,
                 device: torch.device, lora: bool = False) -> None:
        self.width, self.block_size = width, block_size
        tokens = max_batch * width
        # k more positions than the longest sequence: a dummy row's causal reads stay inside.
        blocks = -(-(max_model_len + width) // block_size)
        self.host_ids, self.input_ids = buffer_pair((tokens,), torch.int64, device)
        self.host_positions, self.positions = buffer_pair((tokens,), torch.int64, device)
        self.host_slots, self.slot_mapping = buffer_pair((tokens,), torch.int64, device)
        self.host_tables, self.block_tables = buffer_pair((max_batch, blocks), torch.int32, device)
        self.host_lens, self.context_lens = buffer_pair((max_batch,), torch.int32, device)
        self.host_adapters: torch.Tensor | None = None
        self.adapters: torch.Tensor | None = None
        if lora:
            self.host_adapters, self.adapters = buffer_pair((tokens,), torch.int64, device)
        # Every chunk is width rows long: its start offsets never change.
        self.query_start = torch.arange(0, tokens + 1, width, dtype=torch.int32, device=device)
        self._empty_i32 = torch.zeros(0, dtype=torch.int32, device=device)
        self._empty_table = torch.zeros((0, blocks), dtype=torch.int32, device=device)

    def empty(self, with_lora: bool) -> VerifyBatch:
        """A batch of no rows (all padding), as captures run on."""
        return VerifyBatch([], [], [], [] if with_lora else None)

    def fill(self, batch: VerifyBatch, bucket: int) -> None:
        """Writes batch into items [0, len) and padding into [len, bucket), without waiting for
        the device (the staging buffers' reuse is safe as DecodeInputs.fill says)."""
        n, w, bs = len(batch.token_ids), self.width, self.block_size
        ids, positions = np.zeros((bucket, w), np.int64), np.zeros((bucket, w), np.int64)
        slots = np.full((bucket, w), -1, np.int64)
        tables = self.host_tables.numpy()
        for row, (tokens, first, blocks) in enumerate(
                zip(batch.token_ids, batch.first_positions, batch.block_tables)):
            k = len(tokens)
            if not 0 < k <= w:
                raise RuntimeError(f"a verify item of {k} tokens in graphs of {w} per item")
            pos = np.arange(first, first + k)
            ids[row, :k], positions[row, :k] = tokens, pos
            slots[row, :k] = np.asarray(blocks, np.int64)[pos // bs] * bs + pos % bs
            tables[row, :len(blocks)] = blocks
        lens = np.full(bucket, w, np.int32)
        lens[:n] = np.asarray(batch.first_positions, np.int32) + w
        tokens = bucket * w
        self.host_ids[:tokens] = torch.from_numpy(ids.ravel())
        self.host_positions[:tokens] = torch.from_numpy(positions.ravel())
        self.host_slots[:tokens] = torch.from_numpy(slots.ravel())
        self.host_lens[:bucket] = torch.from_numpy(lens)
        pairs = [(self.host_ids, self.input_ids, tokens),
                 (self.host_positions, self.positions, tokens),
                 (self.host_slots, self.slot_mapping, tokens),
                 (self.host_lens, self.context_lens, bucket),
                 (self.host_tables, self.block_tables, bucket)]
        if batch.adapters is not None:
            if self.adapters is None:
                raise RuntimeError("a verify step with LoRA adapters, but LoRA is off")
            adapters = np.full((bucket, w), -1, np.int64)
            adapters[:n] = np.asarray(batch.adapters, np.int64)[:, None]
            self.host_adapters[:tokens] = torch.from_numpy(adapters.ravel())
            pairs.append((self.host_adapters, self.adapters, tokens))
        for host, dev, count in pairs:
            dev[:count].copy_(host[:count], non_blocking=True)

    def views(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata,
                                          torch.Tensor | None]:
        """Token ids, positions, attention metadata (every token a chunk's: the prefill kernel's
        path alone) and adapter slots over the first bucket items: views, so later fills show
        through."""
        tokens = bucket * self.width
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:tokens], num_prefill_tokens=tokens, prefill_spans=[],
            prefill_block_tables=self.block_tables[:bucket],
            prefill_query_start_loc=self.query_start[:bucket + 1],
            prefill_context_lens=self.context_lens[:bucket],
            decode_block_tables=self._empty_table, decode_context_lens=self._empty_i32)
        adapters = None if self.adapters is None else self.adapters[:tokens]
        return self.input_ids[:tokens], self.positions[:tokens], meta, adapters


class VerifyGraphs(DecodeGraphs):
    """One captured verify pass per bucket (two with LoRA on), in the decode graphs' pool."""
    kind = "verify"


def verify_graphs(model: Forward, spec: SpeculativeConfig | None, max_batch: int,
                  max_model_len: int, block_size: int, device: torch.device,
                  lora: LoRAState | None) -> VerifyGraphs | None:
    """The verify buckets with speculation on (None without): as many token rows as the largest
    decode graph's (max_batch), so the graphs' pool and capture time stay about the decode
    graphs' (vLLM's capture sizes count tokens too), and no more items than speculation runs
    with (disable_by_batch_size). Larger verify steps run eagerly: at large batch the launches
    matter less, and speculation pays off less."""
    if spec is None:
        return None
    width = 1 + spec.num_speculative_tokens
    rows = max(1, max_batch // width)
    if spec.disable_by_batch_size is not None:
        rows = max(1, min(rows, spec.disable_by_batch_size))
    inputs = VerifyInputs(rows, width, max_model_len, block_size, device, lora is not None)
    return VerifyGraphs(model, rows, 0, device, lora, inputs)


def start_verify(graphs: VerifyGraphs, decode: DecodeGraphs, eager: bool) -> None:
    """Captures after the decode graphs, into their pool and within the rest of their time limit
    (eager: the buckets run without graphs)."""
    if eager:
        graphs.use_eager()
    else:
        graphs.capture(max(0.0, CAPTURE_TIME_LIMIT_S - decode.capture_s), decode.pool)


def verify_batch(scheduled: list[Any]) -> VerifyBatch:
    """Each item's last token and draft, from its computed count on. A follower's items carry rank
    0's drafts and LoRA slots, so every rank fills the same buffers."""
    firsts = [s.seq.num_computed_tokens for s in scheduled]
    return VerifyBatch([[s.seq.token_ids[p]] + list(s.draft) for s, p in zip(scheduled, firsts)],
                       firsts, [s.seq.block_ids for s in scheduled], row_adapters(scheduled))


def verify_rows(scheduled: list[Any], width: int) -> list[int]:
    """The real token rows, item by item: each item's last token and draft (as the eager path
    packs them)."""
    return [i * width + j for i, s in enumerate(scheduled) for j in range(1 + len(s.draft))]
