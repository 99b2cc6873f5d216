"""Decode step time of one batch whose sequences use 0, 1, 8 or 32 distinct LoRA adapters, in one
LoRA-enabled engine: what serving many fine-tunes in one batch costs over the base model alone.

Sequences join through the KV hand-off path (reserve_prefilled / commit_prefilled, which also takes
each adapter's slot), so only decode steps run and every configuration times the same work but the
adapters' deltas."""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from baton.loadtest.bench.decode import timed_steps
from baton.services.checkpoints.tiny_lora import ATTENTION, MLP, make_tiny_lora
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.requests import EngineRequest

TARGETS = ATTENTION + MLP


def make_adapters(model_dir: Path, root: Path, count: int, rank: int) -> list[str]:
    """`--lora-modules` words for `count` random adapters of `rank` on every projection."""
    return [f"bench{i}={make_tiny_lora(model_dir, root / f'bench{i}', rank, TARGETS, seed=i)}"
            for i in range(count)]


@dataclass
class LoRARow:
    adapters: int  # distinct adapters in the batch; 0: the base model alone
    batch: int
    context: int
    steps: int
    median_ms: float
    tokens_per_s: float
    vs_base: float = 1.0  # median step time over the base model's


def _join(engine: LLMEngine, adapters: int, batch: int, context: int, max_tokens: int,
          rng: random.Random) -> list[str]:
    vocab = engine.model_config.vocab_size
    ids = []
    for i in range(batch):
        rid = f"lora-{adapters}-{i}"
        name = f"bench{i % adapters}" if adapters else None
        prompt = [rng.randrange(vocab) for _ in range(context)]
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        if engine.reserve_prefilled(EngineRequest(rid, prompt, params, lora_name=name)) is None:
            raise ValueError(f"batch {batch} with {adapters} adapters does not fit (KV cache, "
                             "max_num_seqs, or adapter slots still loading)")
        engine.commit_prefilled(rid, rng.randrange(vocab))
        ids.append(rid)
    return ids


def measure(engine: LLMEngine, adapters: int, batch: int, context: int, steps: int,
            warmup: int, seed: int = 0) -> LoRARow:
    rng = random.Random(seed + adapters)
    ids = _join(engine, adapters, batch, context, warmup + steps + 2, rng)
    times = timed_steps(engine, ids, batch, steps, warmup)
    median = statistics.median(times)
    return LoRARow(adapters, batch, context, len(times), median * 1e3, batch / median)


def format_rows(rows: list[LoRARow]) -> str:
    lines = [f"{'adapters':>9}{'batch':>7}{'context':>9}{'steps':>7}{'median ms':>11}"
             f"{'tok/s':>10}{'x base':>8}"]
    for r in rows:
        lines.append(f"{r.adapters or 'base':>9}{r.batch:>7}{r.context:>9}{r.steps:>7}"
                     f"{r.median_ms:>11.3f}{r.tokens_per_s:>10.1f}{r.vs_base:>8.2f}")
    return "\n".join(lines)
