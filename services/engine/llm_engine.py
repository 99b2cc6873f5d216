"""The engine: requests in, one scheduled forward pass per step, tokens and text out."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase

from baton.services.common.model_config import context_length, load_config
from baton.services.common.outputs import RequestOutput, TokenLogprobs
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.detokenizer import IncrementalDetokenizer
from baton.services.engine.kv.block_manager import BlockManager, Medium, MediumEvent
from baton.services.engine.kv.handoff import HandoffTable, HeldKV, Reservation
from baton.services.engine.kv.tiers.handoff_loads import HandoffLoads
from baton.services.engine.kv.tiers.manager import TierManager
from baton.services.engine.lora.manager import LoRAManager
from baton.services.engine.model_runner import ModelRunner
from baton.services.engine.parallel.executor import Executor
from baton.services.engine.output_processor import OutputProcessor
from baton.services.engine.requests import EngineRequest, RequestIntake
from baton.services.engine.runner import Runner, SimRunnerFactory
from baton.services.engine.sampler import sample, skip_draws
from baton.services.engine.scheduler import ScheduledSeq, Scheduler
from baton.services.engine.sequence import Sequence
from baton.services.engine.speculation.config import (SpeculativeConfig, check_draft_vocab,
                                                      parse_speculative_config)
from baton.services.engine.speculation.draft_model import build_draft_proposer
from baton.services.engine.speculation.eagle import EagleProposer, build_eagle_proposer
from baton.services.engine.speculation.ngram import NgramProposer
from baton.services.engine.speculation.proposer import Proposer
from baton.services.engine.speculation.speculator import Speculator
from baton.services.engine.stats import EngineCounters, EngineStats

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# The engine as a serving process sees it (the worker, whose engine loop sends these to the engine
# thread as named, typed commands): nothing else of it is touched there
# (tests/worker/test_engine_boundary.py checks).
SERVING_API = frozenset({
    "submit", "step", "has_unfinished_requests", "abort",  # requests in, outputs out
    # hand-off, decode side
    "reserve_prefilled", "prefilled_loaded", "commit_prefilled", "park_reserved",
    "release_parked",
    "held_kv", "release_kv",  # hand-off, prefill side
    "stats", "model_id", "block_size", "max_model_len", "kv_cache",  # load and shape
    # KV hand-off: across tensor-parallel sizes, and an EAGLE head's cache with the target's
    "attention_heads", "rank_executor", "head_kv_cache",
    # the prefix cache, mirrored by the router
    "record_block_events", "drain_block_events", "cached_block_hashes",
})


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


def build_tiers(config: EngineConfig, runner: Runner,
                head_cache: torch.Tensor | None = None) -> TierManager | None:
    """The KV tiers below the device cache, when configured (kv/tiers); with an EAGLE head's
    cache, they keep its blocks with the target's."""
    if config.kv_offload_host_gib == 0:
        return None
    if config.engine == "sim":
        raise ValueError("KV tiers need engine=model: the simulated engine holds no KV to copy")
    # Under tensor parallelism the other ranks' tiers follow rank 0's (tiers/replicas.py).
    return TierManager(runner.kv_cache, config.kv_offload_host_gib, config.kv_offload_disk_dir,
                       config.kv_offload_disk_gib, replicas=getattr(runner, "executor", None),
                       head_cache=head_cache)


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
        # The speculator first: the tiers size their slots for an EAGLE head's blocks too.
        self.tiers: TierManager | None = None
        self.speculator = self._speculator(config)
        proposer = getattr(self.speculator, "proposer", None)
        # An EAGLE head's KV goes with the target's in a hand-off and through the tiers
        # (speculation/eagle.py).
        self.eagle = proposer if isinstance(proposer, EagleProposer) else None
        self.tiers = build_tiers(config, self.runner, self.head_kv_cache)
        self.blocks.offload = self.tiers
        self.lora: LoRAManager | None = None
        if config.enable_lora:
            self.lora = LoRAManager(config, self.model_config, self.model_id,
                                    getattr(self.runner, "lora", None))
        self.scheduler = Scheduler(self.blocks, config.max_num_batched_tokens, config.max_num_seqs,
                                   config.enable_chunked_prefill, self.tiers,
                                   swap=config.preemption_mode != "recompute", lora=self.lora)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.counters = EngineCounters()
        # Both ends of a KV hand-off: sequences with blocks taken outside the batch (kv/handoff.py).
        self.handoffs = HandoffTable()
        self.handoff_loads = HandoffLoads(self.tiers, config.block_size, self.model_id)
        self.intake = RequestIntake(config, self.model_config, self.tokenizer, self.eos_ids,
                                    self.max_model_len, self.blocks, self.handoffs, self.lora)
        self.outputs = OutputProcessor(self.intake, self.scheduler, self.handoffs, self.counters,
                                       self.eos_ids)

    def _speculator(self, config: EngineConfig) -> Speculator | None:
        spec = parse_speculative_config(config.speculative_config)
        if spec is None:
            return None
        if config.engine == "sim":
            raise ValueError("speculative decoding needs engine=model: the simulated runner "
                             "scores one position per sequence")
        try:
            proposer = self._proposer(spec)
        except BaseException:
            # The other tensor-parallel ranks are up by now: a refused draft or head stops them.
            self.close()
            raise
        return Speculator(spec, proposer, self.blocks, self.max_model_len,
                          config.max_num_batched_tokens, config.seed)

    def _proposer(self, spec: SpeculativeConfig) -> Proposer:
        if spec.method == "ngram":
            return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
        if spec.method in ("eagle", "eagle3"):
            return build_eagle_proposer(self.config, spec, self.blocks, self.runner, self.dtype,
                                        self.max_model_len)
        check_draft_vocab(spec, self.model_config)
        return build_draft_proposer(self.config, spec, self.blocks, self.dtype, self.device,
                                    self.max_model_len)

    @property
    def seqs(self) -> dict[str, Sequence]:
        """The requests in flight here by id (queued, running, or reserved for a hand-off)."""
        return self.intake.seqs

    @property
    def detokenizers(self) -> dict[str, IncrementalDetokenizer]:
        return self.intake.detokenizers

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
                    priority: int = 0, cache_salt: str | None = None,
                    output_token_ids: list[int] | None = None, hold_kv: bool = False,
                    lora_name: str | None = None) -> None:
        """submit() with the request spelled out (offline callers)."""
        self.submit(EngineRequest(request_id, prompt_token_ids, params, priority, cache_salt,
                                  lora_name),
                    output_token_ids=output_token_ids, hold_kv=hold_kv)

    def submit(self, request: EngineRequest, *, output_token_ids: list[int] | None = None,
               hold_kv: bool = False) -> None:
        """Queues a request. Raises ValueError with a client-facing message when it can never be
        served.

        output_token_ids: tokens already generated (and streamed) elsewhere; generation continues
        after them.
        hold_kv: keep the blocks once finished, until release_kv (the prefill side of a
        hand-off)."""
        seq = self.intake.admit(request, output_token_ids)
        seq.hold_kv = hold_kv
        self.scheduler.add(seq)

    def reserve_prefilled(self, request: EngineRequest) -> Reservation | None:
        """Decode side of a hand-off: blocks for a prompt whose KV was computed elsewhere, the
        leading ones the local prefix cache holds (and those its KV tiers hold, being loaded) need
        no transfer; None when the cache or the batch has no room now. Raises ValueError like
        submit."""
        seq = self.intake.admit(request, prefilled=True)
        hits = self.blocks.cached_prefix(seq, keep_last=False)
        if (len(self.scheduler.running) >= self.config.max_num_seqs
                or not self.blocks.can_admit(hits, seq.num_tokens)
                or not self._lora_slot_for(seq)):
            self.intake.forget(seq.request_id)
            return None
        self.blocks.admit(seq, hits)
        self.blocks.grow(seq, seq.num_tokens)
        seq.num_cached_tokens = seq.num_computed_tokens
        self.scheduler.stats.prefix_cache_queries += seq.num_prompt_tokens
        self.scheduler.stats.prefix_cache_hits += seq.num_cached_tokens
        self.handoffs.reserve(seq)
        loading = self.handoff_loads.start(seq, len(hits))
        return Reservation(list(seq.block_ids), len(hits), loading)

    def prefilled_loaded(self, request_id: str) -> int | None:
        """A reservation's leading blocks in place once its load from the KV tiers has ended (the
        rest are to pull), or None while it runs."""
        return self.handoff_loads.loaded(request_id)

    def _lora_slot_for(self, seq: Sequence) -> bool:
        """The decode side of a hand-off holds its adapter's slot from the reservation on."""
        if self.lora is None:
            return True
        try:
            return self.lora.acquire(seq)
        except ValueError:
            self.intake.forget(seq.request_id)
            raise

    def commit_prefilled(self, request_id: str, first_token: int,
                         first_logprobs: TokenLogprobs | None = None,
                         head_row: torch.Tensor | None = None) -> RequestOutput:
        """The reserved blocks now hold the prompt's KV: join the batch with the prefill worker's
        first token. head_row: the prompt's last target row, when the EAGLE head's KV came too."""
        seq = self.handoffs.take_reserved(request_id)
        cached = seq.num_computed_tokens
        seq.num_computed_tokens = seq.num_tokens
        if head_row is not None and self.eagle is not None:
            self.eagle.handed_off(seq, head_row)
        self.blocks.cache_full_blocks(seq, cached)
        skip_draws(seq, self.model_config.vocab_size, 1)
        self.scheduler.add_running(seq)
        return self.outputs.append(seq, [first_token], [first_logprobs])

    def park_reserved(self, request_id: str) -> int:
        """Moves a reservation out of its request's way, its blocks still taken (a late write may
        still land in them); returns the ticket that release_parked frees them by."""
        seq = self.seqs.get(request_id)
        self.handoff_loads.settle(request_id)
        ticket = self.handoffs.park(request_id)
        if seq is not None and self.lora is not None:
            self.lora.release(seq)
        self.intake.forget(request_id)
        return ticket

    def release_parked(self, ticket: int) -> bool:
        seq = self.handoffs.release_parked(ticket)
        if seq is not None:
            self.blocks.free(seq)
        return seq is not None

    def release_kv(self, request_id: str) -> bool:
        """Ends a held (prefill side: pulled, released or expired) or reserved (decode side)
        hand-off: its blocks go back."""
        self.handoff_loads.settle(request_id)
        seq = self.handoffs.release(request_id)
        if seq is None:
            return False
        self.blocks.free(seq)
        if self.lora is not None:
            self.lora.release(seq)
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
        return HeldKV(list(seq.block_ids), hashes,
                      None if self.eagle is None else self.eagle.last_rows.get(seq))

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
        return self.outputs.finish(seq)

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
            prefill_tokens_per_s=counters.prefill_tokens_per_s(),
            lora=None if self.lora is None else self.lora.stats(),
            lora_running=sorted(sched.running_loras()), lora_waiting=sorted(sched.waiting_loras()),
            tier_load_seconds_per_block=(
                {} if self.tiers is None else self.tiers.load_seconds_per_block()))

    @property
    def block_size(self) -> int:
        return self.blocks.block_size

    @property
    def kv_cache(self) -> torch.Tensor:
        """[layers, blocks, 2, block_size, kv heads, head dim]: what KV transports register."""
        return self.runner.kv_cache

    @property
    def head_kv_cache(self) -> torch.Tensor | None:
        """The EAGLE head's one-layer cache (kv_cache's blocks), which a hand-off moves too."""
        return None if self.eagle is None else self.eagle.runner.attention.kv_cache

    @property
    def attention_heads(self) -> tuple[int, int]:
        """The model's (query heads, KV heads), which its tensor-parallel ranks split."""
        return self.model_config.num_attention_heads, self.model_config.num_key_value_heads

    @property
    def rank_executor(self) -> Executor | None:
        """Rank 0's line to the other tensor-parallel ranks (rank tasks: each rank's KV agent and
        share of a hand-off); None at TP=1."""
        return getattr(self.runner, "executor", None)

    def record_block_events(self) -> None:
        """From now on, log each block that becomes hittable or stops being so."""
        self.blocks.record_events = True
        if self.tiers is not None:
            self.tiers.record_events = True

    def drain_block_events(self) -> list[MediumEvent]:
        """The block events since the last drain, each saying which cache or tier it is about;
        oldest first within each (engine thread only)."""
        events: list[MediumEvent] = [(kind, h, "device") for kind, h in self.blocks.events]
        self.blocks.events = []
        if self.tiers is not None:
            events += self.tiers.drain_events()
        return events

    def cached_block_hashes(self) -> dict[Medium, list[int]]:
        """Every block hash the prefix cache can hit now, and each KV tier can load (engine thread
        only)."""
        hashes: dict[Medium, list[int]] = {"device": list(self.blocks.cached)}
        if self.tiers is not None:
            hashes.update(self.tiers.block_hashes())
        return hashes

    def close(self) -> None:
        """Stops the KV tiers' copy worker and the engine's other tensor-parallel ranks, if any
        (those also stop when this process exits)."""
        if self.tiers is not None:
            self.tiers.close()
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """One scheduled forward pass; returns an output for every request that produced tokens or
        finished."""
        scheduled = self.scheduler.schedule()
        failed = self._fail_unloadable()
        if not scheduled:
            return failed
        started = time.perf_counter()
        if self.speculator is not None:
            self.speculator.propose(scheduled)
        items, logits = self.runner.execute(scheduled)
        # execute() does not wait for the GPU, so on a GPU these are filled while the step's kernels
        # run.
        masks = self.intake.masks
        masks = masks.fill([item.seq for item in items]) if masks else None
        self.scheduler.finish_step(scheduled)
        self.counters.steps += 1
        prompt_counts = [_prompt_tokens_in(s) for s in scheduled]
        prompt_tokens = sum(prompt_counts)
        self.counters.prompt_tokens_computed += prompt_tokens
        seqs = [item.seq for item in items]
        if self.speculator is not None and any(item.draft for item in items):
            accepted, accepted_lps = self.speculator.verify(items, logits, self.generator,
                                                            self.eos_ids, masks)
        else:
            tokens, logprobs = sample(logits, seqs, self.generator, self.eos_ids, masks)
            # One accepted token per sequence: the sampler draws one per row.
            accepted, accepted_lps = [[t] for t in tokens], [[lp] for lp in logprobs]
        emitted = {id(seq): len(tokens) for seq, tokens in zip(seqs, accepted)}
        self._record_step(scheduled, prompt_counts, prompt_tokens, time.perf_counter() - started,
                          emitted)
        if self.lora is not None:
            for item, count in zip(scheduled, prompt_counts):
                self.lora.count_tokens(item.seq.lora_name, count, 0)
            for seq, tokens in zip(seqs, accepted):
                self.lora.count_tokens(seq.lora_name, 0, len(tokens))
        outputs = self.outputs.process(seqs, accepted, accepted_lps)
        if self.eagle is not None:
            for seq in seqs:
                if self.handoffs.held(seq.request_id) is seq:
                    self.eagle.hand_off(seq)
        if self.speculator is not None:
            self.speculator.release_rejected(items)
        return failed + outputs

    def _fail_unloadable(self) -> list[RequestOutput]:
        """Ends the waiting requests whose adapter could not be read from disk any more."""
        failed, self.scheduler.failed = self.scheduler.failed, []
        outputs = []
        for seq, reason in failed:
            log.error("request %s: %s", seq.request_id, reason)
            seq.finish_reason = "abort"
            outputs.append(self.outputs.finish(seq))
        return outputs

    def _record_step(self, scheduled: list[ScheduledSeq], prompt_counts: list[int],
                     prompt_tokens: int, seconds: float, emitted: dict[int, int]) -> None:
        """The step's time, for the prefill rate and the decode cost fit the router reads;
        emitted: tokens each sequence (by id) got, more than one where drafts were accepted."""
        self.counters.recent_step_seconds.append(seconds)
        if prompt_tokens:
            self.counters.recent_prefill_steps.append((prompt_tokens, seconds))
        decode = [s for s, n in zip(scheduled, prompt_counts) if n == 0]
        self.counters.decode_cost.record(len(decode),
                                         sum(s.seq.num_computed_tokens for s in decode), seconds,
                                         sum(emitted.get(id(s.seq), 1) for s in decode))

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
