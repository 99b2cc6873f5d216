"""Per-step time of pure decode steps, beside the HBM floor: the time to read, once, every weight
and the KV of every sequence's context, at the device's memory bandwidth. A decode step can go no
faster than that; a step far above it is bound by something else (kernel launches, host work).

Sequences join through the KV hand-off path (reserve_prefilled / commit_prefilled), so no prefill
runs: the cache holds zeros, which costs the same to read as real keys and values.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.requests import EngineRequest

# Spec-sheet HBM bandwidth in GB/s, by a substring of torch.cuda.get_device_name(); first match
# wins.
BANDWIDTH_GBPS = (
    ("H100 PCIe", 2000.0),
    ("H100 NVL", 3900.0),
    ("H100", 3350.0),
    ("H200", 4800.0),
    ("GH200", 4000.0),
    ("B200", 8000.0),
    ("A100-SXM4-80GB", 2039.0),
    ("A100 80GB PCIe", 1935.0),
    ("A100", 1555.0),
    ("L40S", 864.0),
    ("L4", 300.0),
    ("A10G", 600.0),
)


def default_bandwidth_gbps(device: torch.device) -> float | None:
    """The table's figure for this GPU, or None (a CPU, or a GPU not in the table)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((bw for key, bw in BANDWIDTH_GBPS if key in name), None)


def weight_bytes_per_step(model: torch.nn.Module) -> int:
    """Bytes of weights a decode step reads: every parameter once, except the input embedding, of
    which only the batch's rows are gathered (unless the LM head shares it, and then it is read
    whole)."""
    seen: set[int] = set()
    total = 0
    for param in model.parameters():  # parameters() yields a tied tensor once
        if id(param) not in seen:
            seen.add(id(param))
            total += param.numel() * param.element_size()
    embed = model.model.embed_tokens.weight
    tied = model.lm_head.weight is embed
    return total if tied else total - embed.numel() * embed.element_size()


def kv_bytes_per_token(engine: LLMEngine) -> int:
    return (engine.runner.block_bytes * engine.model_config.num_hidden_layers //
            engine.config.block_size)


@dataclass
class DecodeStepRow:
    batch: int
    context: int
    steps: int
    median_ms: float
    min_ms: float
    floor_ms: float | None
    ratio_to_floor: float | None
    tokens_per_s: float


def join_prefilled(engine: LLMEngine, tag: str, batch: int, context: int, max_tokens: int,
          rng: random.Random) -> list[str]:
    """batch sequences whose first `context` tokens are already in the cache, each with one token to
    decode."""
    vocab = engine.model_config.vocab_size
    ids = []
    for i in range(batch):
        rid = f"{tag}-{i}"
        prompt = [rng.randrange(vocab) for _ in range(context)]
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        if engine.reserve_prefilled(EngineRequest(rid, prompt, params)) is None:
            for joined in ids:
                engine.abort_request(joined)
            raise ValueError(
                f"batch {batch} at context {context} does not fit: the KV cache holds "
                f"{engine.blocks.num_blocks} blocks of {engine.blocks.block_size} tokens (and "
                f"max_num_seqs is {engine.config.max_num_seqs})")
        engine.commit_prefilled(rid, rng.randrange(vocab))
        ids.append(rid)
    return ids


def _sync(engine: LLMEngine) -> None:
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)


def timed_steps(engine: LLMEngine, ids: list[str], batch: int, steps: int,
                warmup: int) -> list[float]:
    """Seconds of each of `steps` engine steps of `batch` decoding sequences, after `warmup`
    untimed ones; the sequences (`ids`) are aborted at the end."""
    times = []
    try:
        for i in range(warmup + steps):
            _sync(engine)
            started = time.perf_counter()
            outputs = engine.step()
            _sync(engine)
            if len(outputs) != batch:
                raise RuntimeError(
                    f"a decode step of batch {batch} returned {len(outputs)} outputs")
            if i >= warmup:
                times.append(time.perf_counter() - started)
    finally:
        for rid in ids:
            engine.abort_request(rid)
    return times


def measure(engine: LLMEngine, batch: int, context: int, steps: int, warmup: int,
            bandwidth_gbps: float | None, seed: int = 0) -> DecodeStepRow:
    """Times `steps` pure decode steps of `batch` sequences at about `context` tokens, after
    `warmup` steps."""
    rng = random.Random(seed + batch * 7919 + context)
    ids = join_prefilled(engine, f"ds-{batch}-{context}", batch, context, warmup + steps + 2, rng)
    times = timed_steps(engine, ids, batch, steps, warmup)
    median = statistics.median(times)
    floor = None
    if bandwidth_gbps:
        read = weight_bytes_per_step(
            engine.runner.model) + batch * context * kv_bytes_per_token(engine)
        floor = read / (bandwidth_gbps * 1e9)
    return DecodeStepRow(batch, context, len(times), median * 1e3,
                         min(times) * 1e3, None if floor is None else floor * 1e3,
                         None if floor is None else median / floor, batch / median)


def format_rows(rows: list[DecodeStepRow]) -> str:
    lines = [f"{'batch':>6}{'context':>9}{'steps':>7}{'median ms':>11}{'min ms':>9}{'floor ms':>10}"
             f"{'x floor':>9}{'tok/s':>11}"]
    for r in rows:
        floor = "n/a" if r.floor_ms is None else f"{r.floor_ms:.3f}"
        ratio = "n/a" if r.ratio_to_floor is None else f"{r.ratio_to_floor:.2f}"
        lines.append(
            f"{r.batch:>6}{r.context:>9}{r.steps:>7}{r.median_ms:>11.3f}{r.min_ms:>9.3f}{floor:>10}"
            f"{ratio:>9}{r.tokens_per_s:>11.1f}")
    return "\n".join(lines)


def row_dict(row: DecodeStepRow) -> dict[str, float | int | None]:
    return asdict(row)
