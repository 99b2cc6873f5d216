"""Conditional disaggregation: per request, prefill on the prefill pool then hand the KV off, or
prefill in place on the decode worker (vLLM's and Dynamo's "conditional disagg").

Remote prefill keeps long prompts from stalling the decode worker's running streams, but costs a
queue at the pool and a KV transfer. So the prompt is computed locally when that is cheap (few
uncached tokens, for example a follow-up turn whose history the decode worker already holds), or
when the pool is backed up, the decode worker would start on it sooner, and it has KV room to spare;
a decode worker short of KV would have to preempt its own streams to compute the prompt, so then the
request waits for the pool instead. Without the "sooner", an overloaded pool pushes its whole
backlog onto the decode workers, which then stall every stream they serve.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from baton.services.common.messages.router import DisaggReason


@dataclass(frozen=True)
class DisaggPolicy:
    max_local_prefill_tokens: int  # at most this many uncached tokens are always computed in place
    max_prefill_queue_s: float  # past this predicted wait the pool counts as backed up
    # local prefill needs free KV blocks >= this x the blocks the prompt needs
    local_kv_headroom: float


@dataclass(frozen=True)
class DisaggInputs:
    uncached_tokens: int  # prompt tokens the decode worker would compute itself
    decode_free_kv_blocks: int
    block_size: int
    # predicted wait at the chosen prefill worker; None when there is none
    prefill_queue_s: float | None
    # predicted wait for the prompt tokens already queued on the decode worker
    decode_queue_s: float = 0.0


@dataclass(frozen=True)
class DisaggDecision:
    remote: bool
    reason: DisaggReason


def decide(inputs: DisaggInputs, policy: DisaggPolicy) -> DisaggDecision:
    if inputs.prefill_queue_s is None:
        return DisaggDecision(False, DisaggReason.NO_PREFILL_WORKER)
    if inputs.uncached_tokens <= policy.max_local_prefill_tokens:
        return DisaggDecision(False, DisaggReason.SHORT_PREFILL)
    if inputs.prefill_queue_s <= policy.max_prefill_queue_s:
        return DisaggDecision(True, DisaggReason.LONG_PREFILL)
    if inputs.decode_queue_s >= inputs.prefill_queue_s:
        return DisaggDecision(True, DisaggReason.DECODE_BUSIER)
    needed_blocks = math.ceil(inputs.uncached_tokens / inputs.block_size)
    if inputs.decode_free_kv_blocks >= policy.local_kv_headroom * needed_blocks:
        return DisaggDecision(False, DisaggReason.PREFILL_POOL_BUSY)
    return DisaggDecision(True, DisaggReason.DECODE_KV_LOW)
