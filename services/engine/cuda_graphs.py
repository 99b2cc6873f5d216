"""CUDA graphs for pure-decode steps.

A decode step of an 8B model launches about a thousand small kernels; issued one by one from Python,
the host, not the GPU, sets the pace. One graph per batch-size bucket replays the whole forward pass
in a single launch. The graphs read persistent input buffers (token ids, positions, slot mapping,
block tables, context lengths), which each step fills in place; rows past the real batch are padding
that writes nothing (slot -1) and attends to nothing (context 0). Block tables are as wide as the
longest sequence allows, so no shape changes between steps. Steps with prefill tokens run eagerly;
speculative verify steps replay graphs of their own, built on this machinery (verify_graphs.py).

With enforce_eager, pure-decode steps still go through the same buffers and buckets, only without
the graph: matrix products then have the same shapes in both modes, so greedy outputs are identical
token for token (a GEMM's rounding may depend on its row count).

Under tensor parallelism every rank holds the same graphs, and rank 0's step message names the
bucket each decode step replays (None: eager), since only rank 0 sees all that decides it (prompt
logprobs, a hidden-state sink): the ranks' all-reduces must pair up call for call, or NCCL waits
forever. The all-reduces are PyTorch's own NCCL collectives (c10d), captured into the graphs as
they are: NCCL supports capture since 2.9 (CUDA 11.3), and since PyTorch 2.1 ProcessGroupNCCL keeps
captured work away from its watchdog, which would otherwise query events recorded during capture,
and graph capture waits for the watchdog's pending queries first. vLLM wraps NCCL itself (pynccl)
and adds a custom all-reduce for latency, not because c10d cannot be captured; one all-reduce path
for eager and graph steps is simpler, and a faster one can replace TPGroup.all_reduce later. The
rules capture imposes, and how they are kept:
- NCCL creates a communicator on its first collective, which capture cannot record: one
  all-reduce runs before the first capture.
- Captured collectives must be identical on every rank, in the same order: every rank captures the
  same buckets, largest first, and agrees bucket by bucket (a MIN over the ranks' votes) whether
  the capture time limit still allows the next one, so no rank stops at another bucket. The
  warm-up runs before each capture execute real all-reduces, so this agreement also keeps them
  paired.
- Launching a graph that holds NCCL operations is itself collective: followers replay exactly the
  bucket rank 0 replays, and run eagerly exactly when it does.

With LoRA on, each bucket is captured twice: on the base model alone, and with the adapters' delta
(kernels/lora_bgmv.py), whose per-row slot it reads from one more persistent buffer (-1: the base,
and every padding row). A step replays the LoRA variant when any row has an adapter. The adapters'
stacks and scales are filled in place (lora/weights.py), so a slot loaded between steps is what the
next replay reads. Why two variants rather than one graph with the delta always in it: the delta
is two launches per adapted projection part (seven parts per Llama layer: 448 kernels on an 8B,
beside its ~1000), which a graph replays even when every row is the base's and each exits at once;
a server with LoRA on whose traffic is mostly the base model would pay them on every step. The
second variant costs capture time (each bucket captured twice) and little memory: both share the
one pool, so only each graph's output buffer is extra. vLLM also keeps a no-adapter capture apart
from its LoRA ones. Under tensor parallelism each rank picks the variant from the slots in rank 0's
step message, so all replay the same graph.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch

from baton.services.engine.layers.attention import AttentionMetadata
from baton.services.engine.parallel.state import get_tp_group

if TYPE_CHECKING:
    from baton.services.engine.lora.weights import LoRAState

log = logging.getLogger(__name__)

# Capture stops (and larger batches run eagerly) past this: start-up must stay bounded on a slow or
# busy device.
CAPTURE_TIME_LIMIT_S = 120.0
# Warm-up runs before each capture, so Triton compiles and allocator growth happen outside the
# graph.
WARMUP_RUNS = 2

Forward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]
Step = TypeVar("Step")


def bucket_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16 up to max_batch (and max_batch itself): padding wastes
    at most 15 rows (vLLM and SGLang pick similar ladders)."""
    sizes = {b
             for b in (1, 2, 4, 8)
             if b <= max_batch} | set(range(16, max_batch + 1, 16)) | {max_batch}
    return sorted(sizes)


def pick_bucket(buckets: list[int], batch: int) -> int | None:
    """The smallest captured bucket that holds batch rows, or None when none does."""
    return next((b for b in buckets if b >= batch), None)


@dataclass
class DecodeBatch:
    """One pure-decode step's inputs, a row per sequence."""
    token_ids: list[int]
    positions: list[int]
    slots: list[int]
    block_tables: list[list[int]]
    context_lens: list[int]
    # Each row's LoRA slot (-1: the base model); None when no row has an adapter.
    adapters: list[int] | None = None


def row_adapters(items: list[Any]) -> list[int] | None:
    """Each item's LoRA slot (-1: the base model), or None when no item has an adapter (the step
    then runs the base model alone)."""
    slots = [s.seq.lora_slot for s in items]
    return None if all(s is None for s in slots) else [-1 if s is None else s for s in slots]


def buffer_pair(shape: tuple[int, ...], dtype: torch.dtype,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A zeroed host staging buffer (pinned on CUDA, so its copy is asynchronous) and its device
    twin."""
    host = torch.zeros(shape, dtype=dtype, pin_memory=device.type == "cuda")
    return host, torch.zeros(shape, dtype=dtype, device=device)


class DecodeInputs:
    """The persistent buffers the graphs read, and host staging buffers they are filled from in one
    copy each."""

    def __init__(self, max_batch: int, max_blocks_per_seq: int, device: torch.device,
                 lora: bool = False) -> None:
        """lora: also an adapter-index buffer, each row's LoRA slot (-1: none)."""
        def pair(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
            return buffer_pair(shape, dtype, device)

        self.width = 1  # token rows per item
        self.host_ids, self.input_ids = pair((max_batch,), torch.int64)
        self.host_positions, self.positions = pair((max_batch,), torch.int64)
        self.host_slots, self.slot_mapping = pair((max_batch,), torch.int64)
        self.host_tables, self.block_tables = pair((max_batch, max_blocks_per_seq), torch.int32)
        self.host_lens, self.context_lens = pair((max_batch,), torch.int32)
        self.slot_mapping.fill_(-1)
        self.host_slots.fill_(-1)
        self.host_adapters: torch.Tensor | None = None
        self.adapters: torch.Tensor | None = None
        if lora:
            self.host_adapters, self.adapters = pair((max_batch,), torch.int64)
        self._empty_i32 = torch.zeros(0, dtype=torch.int32, device=device)
        self._start_loc = torch.zeros(1, dtype=torch.int32, device=device)
        self._empty_table = torch.zeros((0, max_blocks_per_seq), dtype=torch.int32, device=device)

    def fill(self, batch: DecodeBatch, bucket: int) -> None:
        """Writes batch into rows [0, len) and padding into [len, bucket), without waiting for the
        device.

        The staging buffers are reused next step: the step's own sync (the sampler reading its
        tokens back) has finished this step's copies by then."""
        n = len(batch.token_ids)
        self.host_ids[:n] = torch.as_tensor(batch.token_ids)
        self.host_positions[:n] = torch.as_tensor(batch.positions)
        self.host_slots[:n] = torch.as_tensor(batch.slots)
        self.host_lens[:n] = torch.as_tensor(batch.context_lens)
        self.host_ids[n:bucket] = 0
        self.host_positions[n:bucket] = 0
        self.host_slots[n:bucket] = -1
        self.host_lens[n:bucket] = 0
        # Entries past a row's own blocks are never read (the kernel stops at its context length):
        # stale is fine.
        tables = self.host_tables.numpy()
        for row, blocks in enumerate(batch.block_tables):
            tables[row, :len(blocks)] = blocks
        pairs = [(self.host_ids, self.input_ids), (self.host_positions, self.positions),
                 (self.host_slots, self.slot_mapping), (self.host_lens, self.context_lens),
                 (self.host_tables, self.block_tables)]
        # A step without adapters replays the base graph, which never reads the index buffer.
        if batch.adapters is not None:
            if self.adapters is None:
                raise RuntimeError("a decode step with LoRA adapters, but LoRA is off")
            self.host_adapters[:n] = torch.as_tensor(batch.adapters)
            self.host_adapters[n:bucket] = -1
            pairs.append((self.host_adapters, self.adapters))
        for host, dev in pairs:
            dev[:bucket].copy_(host[:bucket], non_blocking=True)

    def empty(self, with_lora: bool) -> DecodeBatch:
        """A batch of no rows (all padding), as captures run on."""
        return DecodeBatch([], [], [], [], [], [] if with_lora else None)

    def views(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata,
                                          torch.Tensor | None]:
        """The forward pass's token ids, positions, attention metadata and adapter slots over the
        first bucket rows."""
        adapters = None if self.adapters is None else self.adapters[:bucket]
        return self.input_ids[:bucket], self.positions[:bucket], self.metadata(bucket), adapters

    def metadata(self, bucket: int) -> AttentionMetadata:
        """Attention metadata over the first bucket rows of the buffers: views, so later fills show
        through."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket], num_prefill_tokens=0, prefill_spans=[],
            prefill_block_tables=self._empty_table, prefill_query_start_loc=self._start_loc,
            prefill_context_lens=self._empty_i32, decode_block_tables=self.block_tables[:bucket],
            decode_context_lens=self.context_lens[:bucket])


class Batch(Protocol):
    token_ids: list  # a row per item
    adapters: list[int] | None


class GraphInputs(Protocol):
    """What a graph set's persistent buffers offer (DecodeInputs, verify_graphs.VerifyInputs)."""
    width: int  # token rows per item

    def fill(self, batch: Batch, bucket: int) -> None:
        ...

    def empty(self, with_lora: bool) -> Batch:
        ...

    def views(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata,
                                          torch.Tensor | None]:
        ...


class Replayable(Protocol):
    def replay(self) -> torch.Tensor:
        """Runs the step on the current contents of the input buffers; returns the hidden states
        [bucket, H]."""


@dataclass
class CapturedStep:
    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor  # the graph's output buffer, overwritten by every replay

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.hidden


class EagerStep:
    """A bucket run without a graph: the same forward, on the same buffers, launched kernel by
    kernel."""

    def __init__(self, graphs: DecodeGraphs, bucket: int, with_lora: bool) -> None:
        self.graphs, self.bucket, self.with_lora = graphs, bucket, with_lora

    def replay(self) -> torch.Tensor:
        return self.graphs.forward_bucket(self.bucket, self.with_lora)


@dataclass
class BucketSteps:
    """A bucket's step on the base model alone, and with the LoRA delta (None with LoRA off)."""
    base: Replayable
    lora: Replayable | None = None


class DecodeGraphs:
    """One captured forward pass per bucket (two with LoRA on), sharing one memory pool (captured
    largest first, as it must be)."""

    kind = "decode"

    def __init__(self, forward: Forward, max_batch: int, max_blocks_per_seq: int,
                 device: torch.device, lora: LoRAState | None = None,
                 inputs: GraphInputs | None = None) -> None:
        """lora: the model's adapter state, whose per-row slots the LoRA variants read from the
        inputs' adapter-index buffer. inputs: other buffers than a decode step's (a verify
        step's, verify_graphs.py)."""
        self.forward = forward
        self.device = device
        self.lora = lora
        self.inputs = inputs or DecodeInputs(max_batch, max_blocks_per_seq, device,
                                             lora is not None)
        self.width = self.inputs.width
        self.pool: tuple[int, int] | None = None
        self.capture_s = 0.0
        self.buckets: list[int] = []
        self.steps: dict[int, BucketSteps] = {}
        self.replays = 0
        self.lora_replays = 0  # of those, the steps with adapters
        self.captured = False
        self._wanted = bucket_sizes(max_batch)

    def forward_bucket(self, bucket: int, with_lora: bool) -> torch.Tensor:
        """The forward pass over the first bucket rows of the buffers; with_lora adds each row's
        adapter delta, its slot read on the device from the adapter-index buffer."""
        ids, positions, meta, adapters = self.inputs.views(bucket)
        if self.lora is not None:
            self.lora.indices = adapters if with_lora else None
        return self.forward(ids, positions, meta)

    def use_eager(self) -> None:
        """Every bucket runs without a graph (enforce_eager)."""
        for bucket in self._wanted:
            lora = EagerStep(self, bucket, True) if self.lora is not None else None
            self.add(bucket, BucketSteps(EagerStep(self, bucket, False), lora))
        log.info("CUDA graphs off (enforce_eager): %s steps run eagerly, padded to buckets %s",
                 self.kind, ",".join(map(str, self.buckets)))

    def capture(self, time_limit_s: float = CAPTURE_TIME_LIMIT_S,
                pool: tuple[int, int] | None = None) -> None:
        """Captures the buckets, largest first, in lockstep with the other tensor-parallel
        ranks; into pool (another graph set's) when given."""
        started = time.perf_counter()
        free_before = torch.cuda.mem_get_info(self.device)[0]
        pool = self.pool = pool or torch.cuda.graph_pool_handle()
        # NCCL makes its communicator on the first collective, which a capture cannot record.
        get_tp_group().all_reduce(torch.zeros(1, device=self.device))
        torch.cuda.synchronize(self.device)
        steps = capture_in_lockstep(list(reversed(self._wanted)),
                                    lambda bucket: self._capture_bucket(bucket, pool),
                                    time_limit_s)
        for bucket, step in steps.items():
            self.add(bucket, step)
        if self.lora is not None:
            self.lora.indices = None
        self.captured = True
        used = free_before - torch.cuda.mem_get_info(self.device)[0]
        self.capture_s = time.perf_counter() - started
        log.info("CUDA graphs: %d %s buckets (%s)%s captured in %.1f s, %.0f MiB",
                 len(self.buckets), self.kind, ",".join(map(str, self.buckets)),
                 " with and without LoRA" if self.lora is not None else "", self.capture_s,
                 used / (1 << 20))

    def _capture_bucket(self, bucket: int, pool: tuple[int, int]) -> BucketSteps:
        base = self._capture_one(bucket, pool, False)
        lora = self._capture_one(bucket, pool, True) if self.lora is not None else None
        return BucketSteps(base, lora)

    @torch.inference_mode()
    def _capture_one(self, bucket: int, pool: tuple[int, int], with_lora: bool) -> CapturedStep:
        self.inputs.fill(self.inputs.empty(with_lora), bucket)
        for _ in range(WARMUP_RUNS):
            self.forward_bucket(bucket, with_lora)
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            hidden = self.forward_bucket(bucket, with_lora)
        return CapturedStep(graph, hidden)

    def add(self, bucket: int, steps: BucketSteps) -> None:
        self.steps[bucket] = steps
        self.buckets = sorted(self.steps)

    def bucket_for(self, batch: int) -> int | None:
        """The bucket a step of batch rows replays, or None when it runs eagerly."""
        return pick_bucket(self.buckets, batch)

    def run(self, batch: Batch, bucket: int | None = None) -> torch.Tensor:
        """Replays bucket (by default the smallest that fits), its LoRA variant when a row has an
        adapter; returns the hidden states of the real rows' tokens (width per row). Under tensor
        parallelism the other ranks are given rank 0's bucket."""
        rows = len(batch.token_ids)
        bucket = self.bucket_for(rows) if bucket is None else bucket
        if bucket not in self.steps or bucket < rows:
            raise RuntimeError(f"{self.kind} bucket {bucket} cannot run {rows} rows on this rank "
                               f"(buckets {self.buckets})")
        steps = self.steps[bucket]
        step = steps.base if batch.adapters is None else steps.lora
        if step is None:
            raise RuntimeError("a decode step with LoRA adapters, but LoRA is off")
        self.inputs.fill(batch, bucket)
        self.replays += 1
        self.lora_replays += batch.adapters is not None
        return step.replay()[:rows * self.width]


def capture_in_lockstep(buckets: list[int], capture_one: Callable[[int], Step],
                        time_limit_s: float,
                        clock: Callable[[], float] = time.perf_counter) -> dict[int, Step]:
    """Captures buckets in the order given while time_limit_s allows, stopping every
    tensor-parallel rank at the same bucket: before each one the ranks agree to go on only if
    all of them are still within the limit."""
    tp = get_tp_group()
    started = clock()
    steps: dict[int, Step] = {}
    for bucket in buckets:
        if not tp.min_int(int(clock() - started <= time_limit_s)):
            log.warning("CUDA graph capture stopped after %.1f s (limit %.0f s, on this or "
                        "another rank): batches below %s rows replay padded to that size",
                        clock() - started, time_limit_s, min(steps, default="no"))
            break
        steps[bucket] = capture_one(bucket)
    return steps
