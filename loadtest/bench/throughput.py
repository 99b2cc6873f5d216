"""Offline throughput: the engine, and transformers' continuous batching as a baseline, on the same
requests.

Both systems get every request at once, greedy decoding with EOS ignored, so each generates exactly
the requested number of tokens (checked), and both are warmed up first; model loading is never
timed.

With a structured output (a JSON schema on every request) a request ends when its grammar completes,
so it generates at most the requested tokens; the unconstrained run it is compared with then asks
for exactly the lengths the constrained run produced, and the two differ only in the grammar's work.
"""
from __future__ import annotations

import datetime
import gc
import math
import os
import platform
import shlex
import sys
from dataclasses import asdict, dataclass, field, replace
from time import perf_counter
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerBase
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.utils import WorkloadHints

from baton.loadtest.workloads import Request, random_workload
from baton.services.common.sampling_params import SamplingParams, StructuredOutput
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine

# Small, but it runs both prefill and decode, so first-call costs (allocations, lazy inits) fall
# outside timing.
WARMUP_PROMPTS, WARMUP_INPUT_LEN, WARMUP_OUTPUT_LEN = 4, 32, 8
# Warm-up tokens come from another stream than the workload's, so they cannot seed its prefix cache.
_WARMUP_SEED_OFFSET = 1_000_003
# transformers drops negative EOS ids: -1 means no EOS, so generation runs to max_new_tokens as in
# the engine.
_NO_EOS = -1
FIGURES = ("requests_per_s", "total_tokens_per_s", "output_tokens_per_s", "elapsed_s")


@dataclass
class ThroughputResult:
    system: str
    num_requests: int
    elapsed_s: float
    prompt_tokens: int
    output_tokens: int
    prompt_tokens_computed: int | None = None  # prefill tokens actually run (cache hits excluded)
    prefix_cache_queries: int | None = None  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int | None = None
    preemptions: int | None = None
    # what the system ran with, to audit fairness
    settings: dict[str, Any] = field(default_factory=dict)
    # per request, in workload order
    output_lens: list[int] = field(default_factory=list, repr=False)

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.elapsed_s

    @property
    def total_tokens_per_s(self) -> float:
        return (self.prompt_tokens + self.output_tokens) / self.elapsed_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s

    @property
    def prefix_hit_ratio(self) -> float | None:
        if not self.prefix_cache_queries or self.prefix_cache_hits is None:
            return None
        return self.prefix_cache_hits / self.prefix_cache_queries

    def as_dict(self) -> dict[str, Any]:
        derived = {name: getattr(self, name) for name in (*FIGURES[:3], "prefix_hit_ratio")}
        doc = {**asdict(self), **derived}
        del doc["output_lens"]
        return doc


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Named special tokens plus added ones flagged special (reserved fillers are not always among
    the named)."""
    added = {i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special}
    return added | set(tokenizer.all_special_ids)


def warmup_workload(vocab_size: int, seed: int, avoid: set[int]) -> list[Request]:
    return random_workload(WARMUP_PROMPTS, WARMUP_INPUT_LEN, WARMUP_OUTPUT_LEN,
                           vocab_size=vocab_size, seed=seed + _WARMUP_SEED_OFFSET, avoid=avoid)


def kv_blocks_for(requests: list[Request], block_size: int) -> int:
    """Room for every request at once, plus a quarter: neither system preempts, and transformers'
    FIFO scheduler, which stops admitting prefills below 15% free blocks, is not throttled by a full
    cache."""
    need = sum(-(-(len(prompt) + n) // block_size) for prompt, n in requests)
    return math.ceil(need * 1.25)


def _check_lengths(system: str, produced: list[int], requests: list[Request],
                   at_most: bool = False) -> None:
    wanted = [n for _, n in requests]
    if at_most and all(1 <= p <= w for p, w in zip(produced, wanted)):
        return
    if produced != wanted:
        bad = sum(p != w for p, w in zip(produced, wanted))
        raise RuntimeError(
            f"{system} generated the wrong number of tokens for {bad} of {len(wanted)} requests")


def _baton_generate(engine: LLMEngine, requests: list[Request],
                    structured: StructuredOutput | None) -> list[int]:
    params = [
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, structured_output=structured)
        for _, n in requests
    ]
    return [len(out.token_ids) for out in engine.generate([p for p, _ in requests], params)]


def run_baton(engine: LLMEngine, requests: list[Request], warmup: list[Request],
              structured: StructuredOutput | None = None) -> ThroughputResult:
    """The engine on the requests; with structured, every request under that grammar (its warm-up
    compiles it, so the timed run sees the cached grammar, as a server does after the schema's first
    request)."""
    system = "baton" if structured is None else "baton+json"
    at_most = structured is not None
    _check_lengths(f"{system} (warm-up)", _baton_generate(engine, warmup, structured), warmup,
                   at_most)
    gc.freeze()  # as a worker does once started (services/worker/server.py)
    stats0, computed0 = replace(engine.scheduler.stats), engine.counters.prompt_tokens_computed
    start = perf_counter()
    produced = _baton_generate(engine, requests, structured)
    elapsed = perf_counter() - start
    _check_lengths(system, produced, requests, at_most)
    stats, c = engine.scheduler.stats, engine.config
    return ThroughputResult(
        system, len(requests), elapsed, sum(len(p) for p, _ in requests), sum(produced),
        output_lens=produced,
        prompt_tokens_computed=engine.counters.prompt_tokens_computed - computed0,
        prefix_cache_queries=stats.prefix_cache_queries - stats0.prefix_cache_queries,
        prefix_cache_hits=stats.prefix_cache_hits - stats0.prefix_cache_hits,
        preemptions=stats.preemptions - stats0.preemptions,
        settings=dict(block_size=c.block_size, num_kv_blocks=engine.runner.num_blocks,
                      max_num_batched_tokens=c.max_num_batched_tokens, max_num_seqs=c.max_num_seqs,
                      enable_prefix_caching=c.enable_prefix_caching,
                      enable_chunked_prefill=c.enable_chunked_prefill, dtype=str(engine.dtype),
                      device=str(engine.device),
                      structured_output=None if structured is None else structured.kind))


@dataclass(frozen=True)
class EngineShape:
    """What transformers needs to run like the engine, kept apart so the engine can be freed
    first."""
    model_dir: str
    dtype: torch.dtype
    device: torch.device
    config: EngineConfig
    num_kv_blocks: int

    @classmethod
    def of(cls, engine: LLMEngine) -> EngineShape:
        return cls(str(engine.model_dir), engine.dtype, engine.device, engine.config,
                   engine.runner.num_blocks)


class _PrefixCounter:
    """Wraps the paged cache's prefix search to count hits: transformers keeps no such
    statistics."""

    def __init__(self, cache: Any) -> None:
        self.hits: dict[str, int] = {}
        self.queries: dict[str, int] = {}
        self._search = cache.search_prefix_match
        cache.search_prefix_match = self

    def __call__(self, request_id: str, prompt_ids: list[int]) -> int:
        matched = self._search(request_id, prompt_ids)
        # A request not admitted is searched again next step; its last search is the one that
        # counted.
        self.queries.setdefault(request_id, len(prompt_ids))
        self.hits[request_id] = matched
        return matched


def _hf_generate(manager: Any, requests: list[Request], tag: str) -> list[int]:
    ids = [f"{tag}-{i}" for i in range(len(requests))]
    for rid, (prompt, n) in zip(ids, requests):
        manager.add_request(prompt, request_id=rid, max_new_tokens=n, eos_token_id=_NO_EOS)
    produced: dict[str, int] = {}
    # Results are taken in any order: get_result(request_id=...) requeues others and stalls on mixed
    # lengths.
    while len(produced) < len(ids):
        result = manager.get_result(timeout=1.0)
        if result is None:
            if not manager.is_running():
                raise RuntimeError("transformers' generation loop stopped with requests pending")
            continue
        if result.is_finished():
            if result.error is not None:
                raise RuntimeError(
                    f"transformers failed request {result.request_id}: {result.error}")
            produced[result.request_id] = len(result.generated_tokens)
    return [produced[rid] for rid in ids]


def _hf_manager(model: Any, requests: list[Request], shape: EngineShape) -> Any:
    """A manager sized like the engine: same page size, KV capacity, token budget and batch size."""
    c = shape.config
    cb_config = ContinuousBatchingConfig(page_size=c.block_size, num_blocks=shape.num_kv_blocks,
                                         max_batch_tokens=c.max_num_batched_tokens,
                                         max_requests_per_batch=c.max_num_seqs,
                                         allow_block_sharing=c.enable_prefix_caching)
    gen_config = GenerationConfig(do_sample=False, max_new_tokens=max(n for _, n in requests),
                                  eos_token_id=_NO_EOS,
                                  pad_token_id=model.generation_config.pad_token_id)
    hints = WorkloadHints(max_prompt_length=max(len(p) for p, _ in requests),
                          max_generated_length=max(n for _, n in requests),
                          num_requests=len(requests))
    return model.init_continuous_batching(generation_config=gen_config,
                                          continuous_batching_config=cb_config,
                                          workload_hints=hints)


def _hf_settings(model: Any, manager: Any) -> dict[str, Any]:
    cb, cache = manager.continuous_batching_config, manager.batch_processor.cache
    return dict(page_size=cb.page_size, num_blocks=cache.num_blocks,
                max_batch_tokens=cb.max_batch_tokens,
                max_requests_per_batch=cb.max_requests_per_batch, scheduler=cb.scheduler_type,
                prefix_sharing=cache.use_prefix_sharing,
                attn_implementation=model.config._attn_implementation, dtype=str(model.dtype),
                device=str(model.device))


def run_hf(shape: EngineShape, requests: list[Request], warmup: list[Request]) -> ThroughputResult:
    """transformers' continuous batching on the engine's checkpoint, dtype and device, sized like
    the engine."""
    model = AutoModelForCausalLM.from_pretrained(shape.model_dir,
                                                 dtype=shape.dtype).to(shape.device)
    manager = _hf_manager(model, requests, shape)
    manager.warmup()
    manager.start()
    try:
        _check_lengths("hf (warm-up)", _hf_generate(manager, warmup, "warmup"), warmup)
        # The loop idles between batches, so swapping the search in now races with nothing.
        counter = _PrefixCounter(manager.batch_processor.cache)
        gc.freeze()  # the same start-up treatment as the engine gets
        start = perf_counter()
        produced = _hf_generate(manager, requests, "req")
        elapsed = perf_counter() - start
        settings = _hf_settings(model, manager)
    finally:
        manager.stop(block=True)
        manager.destroy()
    _check_lengths("hf", produced, requests)
    return ThroughputResult("hf", len(requests), elapsed, sum(len(p) for p, _ in requests),
                            sum(produced), prefix_cache_queries=sum(counter.queries.values()),
                            prefix_cache_hits=sum(counter.hits.values()), settings=settings)


def ratios(ours: ThroughputResult, theirs: ThroughputResult) -> dict[str, float]:
    """ours / theirs for every figure (for elapsed_s, below 1 means ours was faster)."""
    return {name: getattr(ours, name) / getattr(theirs, name) for name in FIGURES}


def machine_info() -> dict[str, Any]:
    """Enough to tell whether two reports are comparable: a shared 2-core box differs from a quiet
    16-core one."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc
                                      ).isoformat(timespec="seconds"), "cpu_count": os.cpu_count(),
        "usable_cpus": usable, "torch_threads": torch.get_num_threads(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": sys.version.split()
                  [0], "platform": platform.platform(), "processor": platform.processor(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None
    }


def _cell(value: float | int | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(results: list[ThroughputResult]) -> str:
    header = (
        f"{'system':<17}{'req/s':>9}{'total tok/s':>13}{'output tok/s':>14}{'elapsed s':>11}"
        f"{'prefix hits/queries':>23}{'hit ratio':>11}{'prompt computed/total':>23}{'preempt':>9}")
    lines = [header]
    for r in results:
        hits = f"{_cell(r.prefix_cache_hits, 'd')}/{_cell(r.prefix_cache_queries, 'd')}"
        computed = f"{_cell(r.prompt_tokens_computed, 'd')}/{r.prompt_tokens}"
        lines.append(
            f"{r.system:<17}{r.requests_per_s:>9.2f}{r.total_tokens_per_s:>13.1f}"
            f"{r.output_tokens_per_s:>14.1f}{r.elapsed_s:>11.2f}{hits:>23}"
            f"{_cell(r.prefix_hit_ratio, '.3f'):>11}{computed:>23}{_cell(r.preemptions, 'd'):>9}")
    if len(results) == 2:
        q = ratios(*results)
        label = f"{results[0].system}/{results[1].system}"
        lines.append(f"{label:<17}{q['requests_per_s']:>9.2f}{q['total_tokens_per_s']:>13.2f}"
                     f"{q['output_tokens_per_s']:>14.2f}{q['elapsed_s']:>11.2f}")
    return "\n".join(lines)


def report(args: dict[str, Any], machine: dict[str, Any], workload: dict[str, Any],
           results: list[ThroughputResult]) -> dict[str, Any]:
    """The --output-json document: figures, the exact command, and where it ran."""
    doc: dict[str, Any] = {
        "command": shlex.join(sys.argv), "args": args, "machine": machine,
        "load_average_after": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "workload": workload, "results": {r.system: r.as_dict()
                                          for r in results}
    }
    if len(results) == 2:
        doc[f"ratio_{results[0].system}_over_{results[1].system}"] = ratios(*results)
    return doc
