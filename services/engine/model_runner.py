"""Turns a scheduled step into one packed forward pass and returns the logits of the rows that sample."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import PretrainedConfig

from baton.services.engine import kv_cache
from baton.services.engine.attention import Attention, AttentionMetadata, PrefillSpan, plan_torch
from baton.services.engine.config import EngineConfig
from baton.services.engine.models.loader import head_dim, load_model
from baton.services.engine.prompt_logprobs import score_prompts
from baton.services.engine.scheduler import ScheduledSeq


def _pad(rows: list[list[int]]) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.int32).reshape(len(rows), width)


class ModelRunner:
    def __init__(self, engine: EngineConfig, config: PretrainedConfig, model_dir: Path, dtype: torch.dtype,
                 device: torch.device, max_model_len: int) -> None:
        self.device = device
        self.block_size = engine.block_size
        backend = engine.attention_backend
        if backend == "auto":
            backend = "triton" if device.type == "cuda" else "torch"
        # Weights first, so that the cache budget on a GPU is what they leave.
        self.attention = Attention(head_dim(config) ** -0.5, backend, engine.block_size)
        self.model = load_model(model_dir, config, self.attention, dtype, device, max_model_len)
        self.num_blocks = kv_cache.num_blocks(engine, config, dtype, device)
        self.attention.kv_cache = kv_cache.allocate(config, self.num_blocks, engine.block_size, dtype, device)
        self.block_bytes = kv_cache.block_bytes(config, engine.block_size, dtype) // config.num_hidden_layers

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """Runs the step. Returns the items that sample, in packed order, and their float32 logits. Sequences that
        asked for prompt logprobs get this step's share appended."""
        packed = [s for s in scheduled if s.num_tokens > 1] + [s for s in scheduled if s.num_tokens == 1]
        ids, positions, meta = self._prepare(packed)
        hidden = self.model(ids, positions, meta)
        if any(s.seq.wants_prompt_logprobs for s in packed):
            score_prompts(packed, hidden, self.model.compute_logits)
        ends = torch.tensor([s.num_tokens for s in packed]).cumsum(0) - 1
        keep = [i for i, s in enumerate(packed) if s.samples]
        logits = self.model.compute_logits(hidden[ends[keep].to(self.device)])
        return [packed[i] for i in keep], logits

    def _prepare(self, packed: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        spans: list[PrefillSpan] = []
        decode_tables, decode_lens = [], []
        for item in packed:
            seq, first, n = item.seq, item.seq.num_computed_tokens, item.num_tokens
            ids += seq.token_ids[first:first + n]
            positions += range(first, first + n)
            blocks = seq.block_ids
            slots += [blocks[p // bs] * bs + p % bs for p in range(first, first + n)]
            if n > 1:
                spans.append(PrefillSpan(len(ids) - n, n, first + n, blocks))
            else:
                decode_tables.append(blocks)
                decode_lens.append(first + 1)
        dev = self.device
        slot_mapping = torch.tensor(slots, dtype=torch.int64, device=dev)
        meta = AttentionMetadata(
            slot_mapping=slot_mapping,
            num_prefill_tokens=sum(s.query_len for s in spans),
            prefill_spans=spans,
            prefill_block_tables=_pad([s.block_ids for s in spans]).to(dev),
            prefill_query_start_loc=torch.tensor([0] + [s.query_start + s.query_len for s in spans],
                                                 dtype=torch.int32, device=dev),
            prefill_context_lens=torch.tensor([s.context_len for s in spans], dtype=torch.int32, device=dev),
            decode_block_tables=_pad(decode_tables).to(dev),
            decode_context_lens=torch.tensor(decode_lens, dtype=torch.int32, device=dev),
        )
        if self.attention.backend == "torch":
            meta.torch_plan = plan_torch(slot_mapping, decode_tables, decode_lens, bs, self.block_bytes)
        return (torch.tensor(ids, dtype=torch.int64, device=dev),
                torch.tensor(positions, dtype=torch.int64, device=dev), meta)
