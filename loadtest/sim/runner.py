"""A stand-in for the ModelRunner that computes nothing: it waits as long as a roofline cost model
says the step would take and returns logits that pin each next token to a hash of the context.

With it the engine's real scheduler, block manager and prefix cache run unchanged, so a simulated
worker emits real KV events, stats and leases: the control plane's test bed for many workers at high
rates on one machine, as llm-d's inference-sim and Dynamo's mocker are for theirs.

Cost of one step (seconds), each term from EngineConfig:
    prefill chunks: base + prefill_tokens / prefill_rate + c * sum(chunk_tokens * context_tokens)
    decode rows:      + per_sequence * decode_batch + per_context_token * sum(decode context tokens)
"""
from __future__ import annotations

import time
from collections.abc import Callable, Collection

import torch
from transformers import PretrainedConfig

from baton.services.engine.config import EngineConfig
from baton.services.engine.scheduler import ScheduledSeq

# The simulated KV cache is one float32 "layer" with one head of width 1: blocks exist (and move in
# a hand-off) but cost almost no memory, so hundreds of simulated workers fit on one machine.
_SIM_LAYERS, _SIM_HEADS, _SIM_HEAD_DIM = 1, 1, 1
_MASKED_LOGIT = -1e4  # far enough below the chosen token that sampling at any temperature picks it
# Knuth's multiplicative hash: neighbouring contexts get unrelated tokens
_HASH_MULTIPLIER = 0x9E3779B1


class SimulatedRunner:

    def __init__(self, engine: EngineConfig, config: PretrainedConfig,
                 avoid_token_ids: Collection[int] = ()) -> None:
        self.config = engine
        self.vocab_size = config.vocab_size
        self.num_blocks = engine.num_kv_blocks or engine.sim_num_kv_blocks
        shape = (_SIM_LAYERS, self.num_blocks, 2, engine.block_size, _SIM_HEADS, _SIM_HEAD_DIM)
        self.kv_cache = torch.zeros(shape, dtype=torch.float32)
        self.block_bytes = self.kv_cache[0, 0].numel() * self.kv_cache.element_size()
        # Tokens the simulation never emits (EOS and the like), so requests run to max_tokens as a
        # real model's long answers would, whatever ignore_eos says.
        self._allowed = torch.tensor(
            [t for t in range(self.vocab_size) if t not in set(avoid_token_ids)])
        # a virtual-time replay swaps in its own clock
        self.sleep: Callable[[float], None] = time.sleep
        self.last_step_seconds = 0.0

    def step_seconds(self, scheduled: list[ScheduledSeq]) -> float:
        c = self.config
        seconds = c.sim_step_base_seconds
        for item in scheduled:
            context = item.seq.num_computed_tokens + item.num_tokens
            if item.num_tokens > 1:
                seconds += item.num_tokens / c.sim_prefill_tokens_per_second
                seconds += c.sim_prefill_seconds_per_token_squared * item.num_tokens * context
            else:
                seconds += (c.sim_decode_seconds_per_sequence +
                            c.sim_decode_seconds_per_context_token * context)
        return seconds

    def next_token(self, item: ScheduledSeq) -> int:
        """A pure function of the context's length and last token: the same on any worker that
        computes it, so a hand-off or a recomputation yields the tokens an uninterrupted run
        would."""
        position = item.seq.num_computed_tokens + item.num_tokens
        last = item.seq.token_ids[position - 1]
        mixed = ((last + 1) * _HASH_MULTIPLIER + position * 0x85EBCA6B) & 0xFFFFFFFF
        return int(self._allowed[mixed % len(self._allowed)])

    def execute(self, scheduled: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], torch.Tensor]:
        """As ModelRunner.execute: the items that sample, in packed order, and their float32
        logits."""
        started = time.perf_counter()
        packed = [s for s in scheduled if s.num_tokens > 1
                  ] + [s for s in scheduled if s.num_tokens == 1]
        keep = [s for s in packed if s.samples]
        logits = torch.full((len(keep), self.vocab_size), _MASKED_LOGIT, dtype=torch.float32)
        if keep:
            rows = torch.arange(len(keep))
            logits[rows, torch.tensor([self.next_token(s) for s in keep])] = 0.0
        self.last_step_seconds = self.step_seconds(scheduled)
        # The step's own Python time counts toward the modelled time rather than on top of it.
        self.sleep(max(0.0, self.last_step_seconds - (time.perf_counter() - started)))
        return keep, logits
