"""The engine: requests in, one scheduled forward pass per step, tokens and text out."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from baton.services.common.decode_cost import DecodeCostFit, DecodeCostModel
from baton.services.common.model_config import context_length, load_config
from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.kv.block_manager import BlockEvent, BlockManager
from baton.services.engine.config import EngineConfig
from baton.services.engine.detokenizer import IncrementalDetokenizer
from baton.services.engine.kv.handoff import EngineRequest, HandoffTable, HeldKV
from baton.services.engine.model_runner import ModelRunner
from baton.services.engine.runner import Runner, SimRunnerFactory
from baton.services.engine.sampler import sample, skip_draws
from baton.services.engine.scheduler import ScheduledSeq, Scheduler
from baton.services.engine.sequence import Sequence
from baton.services.engine.structured.compiler import GrammarCache, make_tokenizer
from baton.services.engine.structured.masks import MaskBuilder
from baton.services.engine.structured.matcher import GrammarState


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# The engine as a serving process sees it (the worker, through its engine thread): nothing else
# of it is touched there (tests/worker/test_engine_boundary.py checks).
SERVING_API = frozenset({
    "submit", "step", "has_unfinished_requests", "abort",  # requests in, outputs out
    # hand-off, decode side
    "reserve_prefilled", "commit_prefilled", "park_reserved", "release_parked",
    "held_kv", "release_kv",  # hand-off, prefill side
    "stats", "model_id", "block_size", "kv_cache",  # load and shape
    # the prefix cache, mirrored by the router
    "record_block_events", "drain_block_events", "cached_block_hashes",
})


@dataclass
class EngineCounters:
    # prefill tokens actually run through the model (cache hits excluded)
    prompt_tokens_computed: int = 0
    generation_tokens: int = 0
    steps: int = 0
    requests_finished: int = 0
    recent_step_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=32))
    # (prompt tokens, seconds) of recent steps that computed prompt tokens, decode rows in them
    # included.
    recent_prefill_steps: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=32))
    decode_cost: DecodeCostModel = field(default_factory=DecodeCostModel)

    def prefill_tokens_per_s(self) -> float | None:
        """How fast this engine has been getting through prompt tokens lately, under its real mix of
        work: what the router divides a queue of prompt tokens by to predict a wait. None before any
        prefill."""
        seconds = sum(s for _, s in self.recent_prefill_steps)
        return sum(t for t, _ in self.recent_prefill_steps) / seconds if seconds > 0 else None


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's load, what a worker reports to the router."""
    num_running: int
    num_waiting: int
    kv_blocks_free: int
    kv_blocks_total: int
    prefill_tokens_queued: int
    decode_rows: int  # running requests past their prompt: the batch a new one would join
    decode_context_tokens: int
    decode_fit: DecodeCostFit | None
    recent_step_seconds: list[float]
    prefill_tokens_per_s: float | None


def _resolve(config: EngineConfig,
             checkpoint_dtype: torch.dtype | None) -> tuple[torch.device, torch.dtype]:
    # The simulated engine computes nothing: its logits are CPU tensors, and simulated workers need
    # no CUDA context.
    device = torch.device("cpu" if config.engine == "sim" else
                          "cuda" if config.device == "auto" and torch.cuda.is_available() else
                          "cpu" if config.device == "auto" else config.device)
    if config.dtype != "auto":
        return device, DTYPES[config.dtype]
    # Half precision is slow on most CPUs; GPUs run the checkpoint's own dtype.
    return device, (checkpoint_dtype or torch.bfloat16) if device.type == "cuda" else torch.float32


def eos_token_ids(model_dir: Path, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    if (model_dir / "generation_config.json").exists():
        eos = GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
        ids |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def _prompt_tokens_in(item: ScheduledSeq) -> int:
    """How many of the tokens just computed for item were prompt tokens (after finish_step advanced
    it)."""
    start = item.seq.num_computed_tokens - item.num_tokens
    return max(0, min(item.num_tokens, item.seq.num_prompt_tokens - start))


def _take_prompt_logprobs(seq: Sequence) -> list[TokenLogprobs | None] | None:
    """The prompt logprobs, once, when all are known (a hand-off's receiver never has them: its
    caller got them from the prefill worker)."""
    done = seq.prompt_logprobs is not None and len(seq.prompt_logprobs) == seq.num_prompt_tokens
    if not done or seq.prompt_logprobs_sent:
        return None
    seq.prompt_logprobs_sent = True
    return seq.prompt_logprobs


class LLMEngine:
    def __init__(self, config: EngineConfig, kv_blocks_wanted: int | None = None,
                 sim_runner: SimRunnerFactory | None = None) -> None:
        """kv_blocks_wanted: without an explicit KV size, this many blocks as far as memory allows
        (benchmarks). sim_runner: what builds the runner under engine=sim
        (baton.loadtest.sim.runner.SimulatedRunner); the caller supplies it because the simulator
        lives in the load-test package, above this one."""
        if config.model is None:
            from baton.services.checkpoints.tiny_model import embedded_model_path
            config = config.model_copy(update={"model": str(embedded_model_path())})
        self.config = config
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.model_dir = Path(config.model)
        self.model_config = load_config(self.model_dir)
        self.model_id = config.served_model_name or self.model_dir.name
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.eos_ids = eos_token_ids(self.model_dir, self.tokenizer)
        self.max_model_len = context_length(self.model_config, config.max_model_len)
        self.device, self.dtype = _resolve(config, getattr(self.model_config, "dtype", None))
        if config.engine == "sim":
            if sim_runner is None:
                raise ValueError("engine=sim needs a sim_runner "
                                 "(baton.loadtest.sim.runner.SimulatedRunner)")
            if kv_blocks_wanted is not None and config.num_kv_blocks is None:
                config = config.model_copy(update={"num_kv_blocks": kv_blocks_wanted})
            self.runner: Runner = sim_runner(config, self.model_config, self.eos_ids)
        else:
            self.runner = ModelRunner(config, self.model_config, self.model_dir, self.dtype,
                                      self.device, self.max_model_len, kv_blocks_wanted)
        self.blocks = BlockManager(self.runner.num_blocks, config.block_size, self.model_id,
                                   config.enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, config.max_num_batched_tokens, config.max_num_seqs,
                                   config.enable_chunked_prefill)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.counters = EngineCounters()
        self.seqs: dict[str, Sequence] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        # Both ends of a KV hand-off: sequences with blocks taken outside the batch (kv/handoff.py).
        self.handoffs = HandoffTable()
        # Built on the first structured request: wrapping a large vocabulary for the grammar engine
        # takes ~1 s.
        self._grammars: GrammarCache | None = None
        self._masks: MaskBuilder | None = None

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None,
                    output_token_ids: list[int] | None = None, hold_kv: bool = False) -> None:
        """submit() with the request spelled out (offline callers)."""
        self.submit(EngineRequest(request_id, prompt_token_ids, params, priority, cache_salt),
                    output_token_ids=output_token_ids, hold_kv=hold_kv)

    def submit(self, request: EngineRequest, *, output_token_ids: list[int] | None = None,
               hold_kv: bool = False) -> None:
        """Queues a request. Raises ValueError with a client-facing message when it can never be
        served.

        output_token_ids: tokens already generated (and streamed) elsewhere; generation continues
        after them.
        hold_kv: keep the blocks once finished, until release_kv (the prefill side of a
        hand-off)."""
        seq = self._new_sequence(request, output_token_ids)
        seq.hold_kv = hold_kv
        self.scheduler.add(seq)

    def _new_sequence(self, request: EngineRequest,
                      output_token_ids: list[int] | None = None) -> Sequence:
        request_id, prompt, params = request.request_id, request.prompt_token_ids, request.params
        if request_id in self.seqs or self.handoffs.held(request_id) is not None:
            raise ValueError(f"request id {request_id!r} is already in flight")
        params.validate(self.config.max_logprobs)
        self._check_engine_params(params)
        outputs = list(output_token_ids or ())
        if len(outputs) >= params.max_tokens:
            raise ValueError(f"the request already has {len(outputs)} output tokens of max_tokens "
                             f"{params.max_tokens}")
        self._check_prompt(prompt + outputs, params, len(outputs))
        seq = Sequence(request_id, prompt, params, priority=request.priority,
                       cache_salt=request.cache_salt, output_token_ids=outputs)
        if params.structured_output is not None:
            seq.grammar = self._grammar(params, outputs)
        skip_draws(seq, self.model_config.vocab_size, len(outputs))
        detok = IncrementalDetokenizer(self.tokenizer.backend_tokenizer, seq.prompt_token_ids,
                                       params)
        # Replaying the tokens generated elsewhere leaves the detokenizer where the first worker's
        # was: text a possible stop string held back is still to be released, and a stop string may
        # complete across the seam.
        for token in outputs:
            detok.add(token)
        detok.release(final=False)
        self.seqs[request_id], self.detokenizers[request_id] = seq, detok
        return seq

    def _grammar(self, params: SamplingParams, outputs: list[int]) -> GrammarState:
        """A matcher for the request's structured output, past the tokens it already generated
        elsewhere."""
        if self._grammars is None:
            vocab = self.model_config.vocab_size
            self._grammars = GrammarCache(make_tokenizer(self.tokenizer, vocab, self.eos_ids),
                                          self.config.grammar_cache_size)
            self._masks = MaskBuilder(vocab)
        state = GrammarState(self._grammars.matcher(params.structured_output))
        state.replay(outputs)
        return state

    def reserve_prefilled(self, request: EngineRequest) -> tuple[list[int], int] | None:
        """Decode side of a hand-off: blocks for a prompt whose KV was computed elsewhere. Returns
        (block ids, number of leading blocks already held by the local prefix cache, which need no
        transfer), or None when the cache or the batch has no room now. Raises ValueError like
        submit."""
        seq = self._new_sequence(request)
        hits = self.blocks.cached_prefix(seq, keep_last=False)
        if (len(self.scheduler.running) >= self.config.max_num_seqs
                or not self.blocks.can_admit(hits, seq.num_tokens)):
            self._forget(seq)
            return None
        self.blocks.admit(seq, hits)
        self.blocks.grow(seq, seq.num_tokens)
        seq.num_cached_tokens = seq.num_computed_tokens
        self.scheduler.stats.prefix_cache_queries += seq.num_prompt_tokens
        self.scheduler.stats.prefix_cache_hits += seq.num_cached_tokens
        self.handoffs.reserve(seq)
        return list(seq.block_ids), len(hits)

    def commit_prefilled(self, request_id: str, first_token: int,
                         first_logprobs: TokenLogprobs | None = None) -> RequestOutput:
        """The reserved blocks now hold the prompt's KV: join the batch with the prefill worker's
        first token."""
        seq = self.handoffs.take_reserved(request_id)
        cached = seq.num_computed_tokens
        seq.num_computed_tokens = seq.num_tokens
        self.blocks.cache_full_blocks(seq, cached)
        skip_draws(seq, self.model_config.vocab_size, 1)
        self.scheduler.add_running(seq)
        return self._append(seq, first_token, first_logprobs)

    def park_reserved(self, request_id: str) -> int:
        """Moves a reservation out of its request's way, its blocks still taken (a late write may
        still land in them); returns the ticket that release_parked frees them by."""
        ticket = self.handoffs.park(request_id)
        del self.seqs[request_id], self.detokenizers[request_id]
        return ticket

    def release_parked(self, ticket: int) -> bool:
        seq = self.handoffs.release_parked(ticket)
        if seq is not None:
            self.blocks.free(seq)
        return seq is not None

    def release_kv(self, request_id: str) -> bool:
        """Ends a held (prefill side: pulled, released or expired) or reserved (decode side)
        hand-off: its blocks go back."""
        seq = self.handoffs.release(request_id)
        if seq is None:
            return False
        self.blocks.free(seq)
        self.seqs.pop(request_id, None)
        self.detokenizers.pop(request_id, None)
        return True

    def held_kv(self, request_id: str) -> HeldKV | None:
        """The blocks a finished prefill holds for a pull, or None when it holds none."""
        seq = self.handoffs.held(request_id)
        if seq is None:
            return None
        full = seq.num_prompt_tokens // self.blocks.block_size
        hashes = seq.full_block_hashes(self.blocks.block_size, self.model_id)[:full]
        return HeldKV(list(seq.block_ids), hashes)

    def _forget(self, seq: Sequence) -> None:
        del self.seqs[seq.request_id], self.detokenizers[seq.request_id]

    def _check_engine_params(self, params: SamplingParams) -> None:
        vocab = self.model_config.vocab_size
        if params.logit_bias and any(t >= vocab for t in params.logit_bias):
            raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
        if params.prompt_logprobs is not None and self.config.engine == "sim":
            raise ValueError(
                "prompt_logprobs needs the model engine; the simulated engine computes no logits")

    def _check_prompt(self, prompt: list[int], params: SamplingParams,
                      num_generated: int = 0) -> None:
        if not prompt:
            raise ValueError("prompt must contain at least one token")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        total = len(prompt) + params.max_tokens - num_generated
        if total > self.max_model_len:
            raise ValueError(
                f"this model's maximum context length is {self.max_model_len} tokens; the request "
                f"asks for {total} ({len(prompt)} prompt + {params.max_tokens} to generate)")
        if self.blocks.blocks_needed(total) > self.blocks.num_blocks:
            raise ValueError(f"the request needs {total} tokens of KV cache; this worker holds "
                             f"{self.blocks.num_blocks * self.blocks.block_size}")
        if not self.config.enable_chunked_prefill and total > self.config.max_num_batched_tokens:
            raise ValueError(
                "with chunked prefill off, prompt plus output is limited to "
                "max_num_batched_tokens "
                f"({self.config.max_num_batched_tokens})")

    def abort(self, request_id: str) -> bool:
        """abort_request, saying whether the request was anywhere here."""
        found = request_id in self.seqs or self.handoffs.state(request_id) is not None
        self.abort_request(request_id)
        return found

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Stops a request wherever it is (queued, running, awaiting its KV, or held for a pull)."""
        if self.handoffs.state(request_id) is not None:
            self.release_kv(request_id)
            return None
        seq = self.seqs.get(request_id)
        if seq is None:
            return None
        seq.finish_reason = "abort"
        return self._finish(seq)

    def decode_load(self) -> tuple[int, int]:
        """(rows, context tokens) of the running requests past their prompt: the batch a new one
        would join."""
        rows = [s for s in self.scheduler.running if s.num_computed_tokens >= s.num_prompt_tokens]
        return len(rows), sum(s.num_computed_tokens for s in rows)

    def stats(self) -> EngineStats:
        """Safe to read off the engine thread: each figure is read once, the lists copied."""
        rows, context_tokens = self.decode_load()
        sched, counters = self.scheduler, self.counters
        return EngineStats(
            num_running=len(sched.running), num_waiting=len(sched.waiting),
            kv_blocks_free=self.blocks.num_free_blocks, kv_blocks_total=self.blocks.num_blocks,
            prefill_tokens_queued=sched.prefill_tokens_queued(), decode_rows=rows,
            decode_context_tokens=context_tokens, decode_fit=counters.decode_cost.fit(),
            recent_step_seconds=list(counters.recent_step_seconds),
            prefill_tokens_per_s=counters.prefill_tokens_per_s())

    @property
    def block_size(self) -> int:
        return self.blocks.block_size

    @property
    def kv_cache(self) -> torch.Tensor:
        """[layers, blocks, 2, block_size, kv heads, head dim]: what KV transports register."""
        return self.runner.kv_cache

    def record_block_events(self) -> None:
        """From now on, log each block that becomes hittable or stops being so."""
        self.blocks.record_events = True

    def drain_block_events(self) -> list[BlockEvent]:
        """The block events since the last drain, oldest first (engine thread only)."""
        events, self.blocks.events = self.blocks.events, []
        return events

    def cached_block_hashes(self) -> list[int]:
        """Every block hash the prefix cache can hit now (engine thread only)."""
        return list(self.blocks.cached)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """One scheduled forward pass; returns an output for every request that produced tokens or
        finished."""
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        started = time.perf_counter()
        items, logits = self.runner.execute(scheduled)
        # execute() does not wait for the GPU, so on a GPU these are filled while the step's kernels
        # run.
        masks = self._masks.fill([item.seq for item in items]) if self._masks else None
        self.scheduler.finish_step(scheduled)
        self.counters.steps += 1
        prompt_counts = [_prompt_tokens_in(s) for s in scheduled]
        prompt_tokens = sum(prompt_counts)
        self.counters.prompt_tokens_computed += prompt_tokens
        seqs = [item.seq for item in items]
        tokens, logprobs = sample(logits, seqs, self.generator, self.eos_ids, masks)
        seconds = time.perf_counter() - started
        self.counters.recent_step_seconds.append(seconds)
        if prompt_tokens:
            self.counters.recent_prefill_steps.append((prompt_tokens, seconds))
        decode = [s for s, n in zip(scheduled, prompt_counts) if n == 0]
        self.counters.decode_cost.record(len(decode),
                                         sum(s.seq.num_computed_tokens for s in decode), seconds)
        return [self._append(seq, token, lp) for seq, token, lp in zip(seqs, tokens, logprobs)]

    def _append(self, seq: Sequence, token: int, logprobs: TokenLogprobs | None) -> RequestOutput:
        seq.token_ids.append(token)
        self.counters.generation_tokens += 1
        if seq.logprobs is not None and logprobs is not None:
            seq.logprobs.append(logprobs)
        stop = self.detokenizers[seq.request_id].add(token)
        p = seq.params
        # A token the grammar refuses can only come from a hand-off whose first token was drawn
        # unconstrained.
        grammar_ok = seq.grammar is None or seq.grammar.advance(token)
        if not grammar_ok:
            seq.finish_reason = "abort"
        elif stop is not None:
            seq.finish_reason, seq.stop_reason = "stop", stop
        elif token in p.stop_token_ids and seq.num_output_tokens >= p.min_tokens:
            seq.finish_reason, seq.stop_reason = "stop", token
        elif token in self.eos_ids and not p.ignore_eos and seq.num_output_tokens >= p.min_tokens:
            seq.finish_reason = "stop"
        elif seq.grammar is not None and seq.grammar.done:
            seq.finish_reason = "stop"  # the grammar's output is complete
        elif seq.num_output_tokens >= p.max_tokens:
            seq.finish_reason = "length"
        if seq.finish_reason is not None:
            return self._finish(seq, num_new=1)
        return self._output(seq, num_new=1, final=False)

    def _finish(self, seq: Sequence, num_new: int = 0) -> RequestOutput:
        hold = seq.hold_kv and seq.finish_reason != "abort"
        self.scheduler.remove(seq, free_blocks=not hold)
        self.counters.requests_finished += 1
        out = self._output(seq, num_new=num_new, final=True)
        if hold:
            self.handoffs.hold(seq)
        del self.seqs[seq.request_id], self.detokenizers[seq.request_id]
        return out

    def _output(self, seq: Sequence, num_new: int, final: bool) -> RequestOutput:
        detok = self.detokenizers[seq.request_id]
        new_text = detok.release(final)
        # The histories stay where they grow (token and logprob lists only append; text past
        # `released` is the only text ever cut): each output keeps a length, not a copy.
        tokens, end, lps = seq.token_ids, seq.num_tokens, seq.logprobs
        num_lps = 0 if lps is None else len(lps)
        snapshot = RequestOutput.snapshot
        return RequestOutput(
            request_id=seq.request_id, prompt_token_ids=seq.prompt_token_ids,
            token_ids=snapshot(seq, "token_ids", seq.num_prompt_tokens, end),
            text=snapshot(detok, "text", 0, detok.released), num_new_tokens=num_new,
            new_text=new_text, finished=final, finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
            logprobs=None if lps is None else snapshot(seq, "logprobs", 0, num_lps),
            num_cached_tokens=seq.num_cached_tokens, new_token_ids=tokens[end - num_new:end],
            new_logprobs=None if lps is None else lps[max(0, num_lps - num_new):num_lps],
            prompt_logprobs=_take_prompt_logprobs(seq))

    def generate(self, prompts: list[list[int]],
                 params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        """Offline convenience: runs prompts to completion and returns their final outputs in
        order."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"gen-{time.monotonic_ns()}-{i}" for i in range(len(prompts))]
        for rid, prompt, p in zip(ids, prompts, params_list):
            self.add_request(rid, prompt, p)
        done: dict[str, RequestOutput] = {}
        scored: dict[str, list[TokenLogprobs | None]] = {}
        while self.has_unfinished_requests():
            for out in self.step():
                keep_prompt_logprobs(out, scored)
                if out.finished:
                    done[out.request_id] = out
        return [done[rid] for rid in ids]


def keep_prompt_logprobs(out: RequestOutput, scored: dict[str, list[TokenLogprobs | None]]) -> None:
    """For callers that keep only final outputs: prompt logprobs arrive once, maybe before the end;
    this puts them on the final output too."""
    if out.prompt_logprobs is not None:
        scored[out.request_id] = out.prompt_logprobs
    if out.finished:
        out.prompt_logprobs = scored.pop(out.request_id, None)
