"""Turns a scheduled step into one packed forward pass and returns the logits of the rows that
sample."""
from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PretrainedConfig

from baton.services.common.model_config import head_dim
from baton.services.engine.kv import kv_cache
from baton.services.engine.config import EngineConfig
from baton.services.engine.cuda_graphs import DecodeBatch, DecodeGraphs, row_adapters
from baton.services.engine.layers.attention import (Attention, AttentionMetadata, PrefillSpan,
                                                    plan_torch)
from baton.services.engine.lora.replicas import LoRAReplicas
from baton.services.engine.lora.weights import LoRAState, attach
from baton.services.engine.models.loader import load_model
from baton.services.engine.parallel.executor import Executor, start_executor
from baton.services.engine.parallel.sharding import check_splits, local_kv_heads
from baton.services.engine.parallel.state import get_tp_group
from baton.services.engine.parallel.step_sync import MirrorItem, StepEncoder
from baton.services.engine.prompt_logprobs import score_prompts, scoring_plan
from baton.services.engine.scheduler import ScheduledSeq
from baton.services.engine.speculation.config import parse_speculative_config
from baton.services.engine.speculation.footprint import draft_footprint
from baton.services.engine.verify_graphs import (VerifyGraphs, start_verify, verify_batch,
                                                 verify_graphs, verify_rows)

log = logging.getLogger(__name__)

# What an EAGLE proposer is handed after each forward pass: the packed items and each position's
# hidden states, in the same order (rows of [positions, hidden * layers]).
HiddenSink = Callable[[list[ScheduledSeq], torch.Tensor], None]


def _block_table(tables: list[list[int]]) -> torch.Tensor:
    """[rows, longest] int64, zero-padded; filled row by row in C rather than per element in
    Python."""
    out = np.zeros((len(tables), max((len(t) for t in tables), default=0)), dtype=np.int64)
    for row, blocks in enumerate(tables):
        out[row, :len(blocks)] = blocks
    return torch.from_numpy(out)


class ModelRunner:
    """The model and its KV cache on this process's device. Under tensor parallelism (rank 0, the
    engine's process) it starts the other ranks first and sends them each step's inputs; the
    other ranks build theirs with follower=True and run execute_follower."""

    def __init__(self, engine: EngineConfig, config: PretrainedConfig, model_dir: Path,
                 dtype: torch.dtype, device: torch.device, max_model_len: int,
                 kv_blocks_wanted: int | None = None, follower: bool = False) -> None:
        self.device = device
        self.block_size = engine.block_size
        backend = engine.attention_backend
        if backend == "auto":
            backend = "triton" if device.type == "cuda" else "torch"
        self.executor: Executor | None = None
        self.encoder: StepEncoder | None = None
        self.hidden_sink: HiddenSink | None = None
        tp_size = engine.tensor_parallel_size
        check_splits(config, tp_size)
        if tp_size > 1 and not follower:
            if device.type == "cuda":
                device = self.device = _rank0_device(tp_size, engine)
            self.executor = start_executor(engine, str(model_dir), dtype, device, max_model_len,
                                           kv_blocks_wanted)
            self.encoder = StepEncoder()
        try:
            self._build(engine, config, model_dir, dtype, max_model_len, kv_blocks_wanted, backend)
        except BaseException:
            self.close()
            raise

    def _build(self, engine: EngineConfig, config: PretrainedConfig, model_dir: Path,
               dtype: torch.dtype, max_model_len: int, kv_blocks_wanted: int | None,
               backend: str) -> None:
        device, tp = self.device, get_tp_group()
        kv_heads = local_kv_heads(config, tp.size)
        # Weights first, so that the cache budget on a GPU is what they leave.
        self.attention = Attention(head_dim(config) ** -0.5, backend, engine.block_size)
        self.model = load_model(model_dir, config, self.attention, dtype, device, max_model_len)
        # Adapter slots are weights too: allocated before the cache takes what is left.
        self.lora: LoRAState | None = None
        if engine.enable_lora:
            self.lora = attach(self.model, engine.max_loras, engine.max_lora_rank, dtype, device)
            if self.executor is not None:
                self.lora.replicas = LoRAReplicas(self.executor.send)
        # Every rank's cache has the same blocks (rank 0 allocates for all): the fewest any fits.
        # A speculative draft loads after the target: its weights and cache are left room for.
        draft = draft_footprint(engine.speculative_config, config, engine.block_size, dtype,
                                tp.size)
        companion = draft and kv_cache.Companion(draft.weight_bytes, draft.block_bytes)
        self.num_blocks = tp.min_int(kv_cache.num_blocks(engine, config, dtype, device,
                                                         max_model_len, kv_blocks_wanted, kv_heads,
                                                         companion))
        self.attention.kv_cache = kv_cache.allocate(config, self.num_blocks, engine.block_size,
                                                    dtype, device, kv_heads,
                                                    engine.kv_cache_layout)
        self.block_bytes = kv_cache.block_bytes(config, engine.block_size, dtype,
                                                kv_heads) // config.num_hidden_layers
        # Bytes of weights each rank holds, rank order (what item 3 of issue 26 bounds).
        self.rank_weight_bytes: list[int] = tp.all_gather_object(weight_bytes(self.model))
        if tp.size > 1:
            log.info("tensor-parallel rank %d of %d: %d bytes of weights, %d KV blocks of %d "
                     "heads", tp.rank, tp.size, self.rank_weight_bytes[tp.rank], self.num_blocks,
                     kv_heads)
        self.graphs, self.verify_graphs = _decode_graphs(self.model, engine, device, backend,
                                                         max_model_len, self.lora)

    def close(self) -> None:
        """Stops the other tensor-parallel ranks, if any."""
        if self.executor is not None:
            self.executor.close()
            self.executor = None

    @property
    def kv_cache(self) -> torch.Tensor:
        return self.attention.kv_cache

    def capture_hidden(self, layers: tuple[int, ...] | None, sink: HiddenSink) -> None:
        """After every forward pass, hands sink the hidden states of every position: the inputs
        of `layers`, side by side, or with None the final (normed) ones the lm_head reads. With
        layers, decode and verify steps then run eagerly: the captured graphs keep no layer
        inputs; the final hidden states are the graphs' own output."""
        self.model.capture_layers = layers or ()
        self.hidden_sink = sink

    def _step_graphs(self, items: list[Any]) -> DecodeGraphs | None:
        """The graph set a step of these items would replay: the verify graphs when any carries a
        draft (every rank sees the drafts), else the decode graphs."""
        return self.verify_graphs if any(s.draft for s in items) else self.graphs

    def _decode_bucket(self, scheduled: list[ScheduledSeq]) -> int | None:
        """The graph bucket a pure-decode or verify step replays, or None when the step runs
        eagerly (prompt scoring and a hidden-state sink of layer inputs need the eager path's
        hidden states). Under tensor parallelism only this, rank 0's, decision counts: its step
        message carries it."""
        graphs = self._step_graphs(scheduled)
        if graphs is None or self.model.capture_layers:
            return None
        # A verify item's draft may be shorter than the graphs' k: its chunk is padded.
        if not all(s.num_tokens == 1 and len(s.draft) < graphs.width
                   and not s.seq.wants_prompt_logprobs for s in scheduled):
            return None
        # With LoRA on, the graphs carry the adapters' delta too (cuda_graphs.py).
        if graphs.lora is None and any(s.seq.lora_slot is not None for s in scheduled):
            return None
        return graphs.bucket_for(len(scheduled))

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """Runs the step. Returns the items that sample, in packed order, and their float32 logits:
        one row each, or one per position for an item with a draft (1 + its length). Sequences that
        asked for prompt logprobs get this step's share appended."""
        if self.lora is not None:
            self.lora.indices = None
        bucket = self._decode_bucket(scheduled)
        if bucket is not None:
            if self.executor is not None:
                self.executor.send(self.encoder.encode(scheduled, [], bucket))
            return self._replay(scheduled, bucket)
        # A draft makes its item a short chunk over cached context: the chunked-prefill attention
        # (paged, causal within the chunk) is the multi-query attention that verifies it.
        packed = [s for s in scheduled if s.num_positions > 1
                  ] + [s for s in scheduled if s.num_positions == 1]
        plan = scoring_plan(packed) if any(s.seq.wants_prompt_logprobs for s in packed) else []
        if self.executor is not None:
            rows = [(row, row + stop - start) for _, start, stop, row in plan]
            self.executor.send(self.encoder.encode(packed, rows))
        ids, positions, meta, sample_rows = self._prepare(packed)
        hidden = self.model(ids, positions, meta)
        if self.hidden_sink is not None:
            self.hidden_sink(packed, self.model.captured if self.model.capture_layers else hidden)
        if plan:
            score_prompts(packed, hidden, self.model.compute_logits, plan)
        keep = [i for i, s in enumerate(packed) if s.samples]
        return [packed[i] for i in keep], self.model.compute_logits(hidden[sample_rows])

    def _replay(self, scheduled: list[Any], bucket: int) -> tuple[list[Any], torch.Tensor]:
        """A pure-decode or verify step through the graph buffers: the items that sample and their
        logits (as execute returns them)."""
        keep = [i for i, s in enumerate(scheduled) if s.samples]
        if any(s.draft for s in scheduled):
            graphs = self.verify_graphs
            out = graphs.run(verify_batch(scheduled), bucket)
            # Gathered, so a copy: a sink may keep it past the next replay.
            hidden = out[torch.tensor(verify_rows(scheduled, graphs.width), device=out.device)]
        else:
            hidden = self.graphs.run(decode_batch(scheduled, self.block_size), bucket)
            if self.hidden_sink is not None:
                hidden = hidden.clone()
        if self.hidden_sink is not None:
            self.hidden_sink(scheduled, hidden)
        # Every position of an item that samples samples (one per decode item): all rows, unless
        # an item does not.
        if len(keep) < len(scheduled):
            ends = torch.tensor([s.num_positions for s in scheduled]).cumsum(0)
            hidden = hidden[_sample_rows(scheduled, ends).to(hidden.device)]
        return [scheduled[i] for i in keep], self.model.compute_logits(hidden)

    @torch.inference_mode()
    def execute_follower(self, packed: list[MirrorItem], score_rows: list[tuple[int, int]],
                         bucket: int | None = None) -> None:
        """A rank other than 0: the same forward pass and lm_head calls as rank 0's execute, whose
        logits only rank 0 receives; through the graph bucket rank 0 replays, if any."""
        if self.lora is not None:
            self.lora.indices = None
        if bucket is not None:
            self._replay(packed, bucket)
            return
        ids, positions, meta, sample_rows = self._prepare(packed)
        hidden = self.model(ids, positions, meta)
        for start, stop in score_rows:
            self.model.compute_logits(hidden[start:stop])
        self.model.compute_logits(hidden[sample_rows])

    def _prepare(
        self, packed: list[ScheduledSeq]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """Per-token positions and slots come from tensor arithmetic over per-sequence values, and
        everything the device needs crosses in one copy."""
        bs = self.block_size
        counts = torch.tensor([s.num_positions for s in packed])
        firsts = torch.tensor([s.seq.num_computed_tokens for s in packed])
        ids = torch.tensor(
            list(
                chain.from_iterable(
                    s.seq.token_ids[s.seq.num_computed_tokens:s.seq.num_computed_tokens +
                                    s.num_tokens] + s.draft for s in packed)))
        ends = counts.cumsum(0)
        row = torch.repeat_interleave(torch.arange(len(packed)), counts)
        positions = firsts[row] + torch.arange(len(ids)) - (ends - counts)[row]
        tables = _block_table([s.seq.block_ids for s in packed])
        slots = tables[row, positions // bs] * bs + positions % bs
        num_prefill = sum(1 for s in packed if s.num_positions > 1)
        sample_rows = _sample_rows(packed, ends)
        lens = firsts + counts
        query_start = torch.cat((torch.zeros(1, dtype=torch.int64), ends[:num_prefill]))
        host = [ids, positions, slots, sample_rows, tables.flatten(), query_start, lens]
        adapters = self._lora_slots(packed)
        if adapters is not None:
            host.append(adapters[row])
        dev = torch.cat(host).to(self.device, non_blocking=True).split([len(t) for t in host])
        ids_d, positions_d, slots_d, sample_d, tables_d, start_d, lens_d = dev[:7]
        if adapters is not None:
            self.lora.indices = dev[7]
        tables_d = tables_d.view(tables.shape).to(torch.int32)
        spans = [
            PrefillSpan(int(ends[i] - counts[i]), int(counts[i]), int(lens[i]), s.seq.block_ids)
            for i, s in enumerate(packed[:num_prefill])
        ]
        meta = AttentionMetadata(
            slot_mapping=slots_d,
            num_prefill_tokens=int(ends[num_prefill - 1]) if num_prefill else 0,
            prefill_spans=spans, prefill_block_tables=tables_d[:num_prefill],
            prefill_query_start_loc=start_d.to(torch.int32),
            prefill_context_lens=lens_d[:num_prefill].to(torch.int32),
            decode_block_tables=tables_d[num_prefill:],
            decode_context_lens=lens_d[num_prefill:].to(torch.int32))
        if self.attention.backend == "torch":
            decodes = packed[num_prefill:]
            meta.torch_plan = plan_torch(slots_d, [s.seq.block_ids for s in decodes],
                                         lens[num_prefill:].tolist(), bs, self.block_bytes)
        return ids_d, positions_d, meta, sample_d

    def _lora_slots(self, packed: list[ScheduledSeq]) -> torch.Tensor | None:
        """Each sequence's adapter slot (-1: the base model); None when no sequence has one."""
        slots = None if self.lora is None else row_adapters(packed)
        return None if slots is None else torch.tensor(slots)


def _sample_rows(packed: list[ScheduledSeq], ends: torch.Tensor) -> torch.Tensor:
    """The packed rows whose logits are sampled: each sampling item's last, and every position of
    an item with a draft."""
    if not any(s.draft for s in packed):
        return (ends - 1)[[i for i, s in enumerate(packed) if s.samples]]
    stops = ends.tolist()
    return torch.tensor([row for s, stop in zip(packed, stops) if s.samples
                         for row in range(stop - 1 - len(s.draft), stop)], dtype=torch.int64)


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _rank0_device(tp_size: int, engine: EngineConfig) -> torch.device:
    """cuda:0, after checking this node has a GPU for every rank that runs on it."""
    visible = torch.cuda.device_count()
    if engine.distributed_executor_backend == "mp" and tp_size > visible:
        raise ValueError(f"--tensor-parallel-size {tp_size} needs {tp_size} GPUs, but {visible} "
                         "are visible (use --distributed-executor-backend ray across nodes)")
    return torch.device("cuda", 0)


def _decode_graphs(model: torch.nn.Module, engine: EngineConfig, device: torch.device,
                   backend: str, max_model_len: int, lora: LoRAState | None
                   ) -> tuple[DecodeGraphs | None, VerifyGraphs | None]:
    """The decode buckets, and the verify buckets with speculation on, the same on every
    tensor-parallel rank (the same settings, captured together); checked, since a rank replaying a
    bucket another lacks would hang them all."""
    graphs = verify = None
    if bucketed_decode(device, backend):
        max_batch = min(engine.cuda_graph_max_batch_size, engine.max_num_seqs)
        graphs = DecodeGraphs(model, max_batch, -(-max_model_len // engine.block_size), device,
                              lora)
        verify = verify_graphs(model, parse_speculative_config(engine.speculative_config),
                               max_batch, max_model_len, engine.block_size, device, lora)
        eager = engine.enforce_eager or device.type != "cuda"
        if eager:
            graphs.use_eager()
        else:
            graphs.capture()
        if verify is not None:
            start_verify(verify, graphs, eager)
    held = get_tp_group().all_gather_object(
        [None if g is None else g.buckets for g in (graphs, verify)])
    if any(buckets != held[0] for buckets in held):
        raise RuntimeError(f"tensor-parallel ranks hold different decode/verify buckets: {held}")
    return graphs, verify


def bucketed_decode(device: torch.device, backend: str) -> bool:
    """Decode steps go through the graph buffers with the Triton attention (whose decode kernel
    reads its lengths on the device): captured on CUDA unless enforce_eager, run eagerly
    elsewhere (Triton's interpreter on CPU, which the tests use)."""
    if backend == "triton":
        return True
    if device.type == "cuda":
        log.warning("CUDA graphs need attention_backend triton; decode steps run eagerly")
    return False


def decode_batch(scheduled: list[ScheduledSeq], block_size: int) -> DecodeBatch:
    """One token per sequence: its position is the sequence's computed length. A follower's items
    carry rank 0's LoRA slots, so every rank fills the same adapter indices."""
    positions = [s.seq.num_computed_tokens for s in scheduled]
    tables = [s.seq.block_ids for s in scheduled]
    return DecodeBatch(
        token_ids=[s.seq.token_ids[p] for s, p in zip(scheduled, positions)], positions=positions,
        slots=[t[p // block_size] * block_size + p % block_size for t, p in zip(tables, positions)],
        block_tables=tables, context_lens=[p + 1 for p in positions],
        adapters=row_adapters(scheduled))
