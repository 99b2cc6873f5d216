"""Faults on the prefill side of a hand-off, through the gateway with the official clients: a client
that leaves during a long prefill frees the prefill worker's blocks and lease at once (not when the
lease runs out), and a request placed on a stalled (SIGSTOPped) prefill worker is prefilled on its
decode worker once the prefill deadline passes, with the very tokens of an undisturbed run."""
from __future__ import annotations

import asyncio
import signal
import time

import openai
import pytest

from tests.gateway.leaving_client import leave_once_running
from tests.launcher import Stack, metric, start_stack, wait_for

PREFILL_TIMEOUT_S = 3.0
# A long prefill: two prompt tokens per engine step, and ~1900 tokens (nearly the context).
LONG_PROMPT = " ".join(f"w{i}" for i in range(500))


@pytest.fixture(scope="module")
def stack(model):
    """Every prompt prefilled remotely (never locally, however slow the prefill worker looks), no
    latency SLOs: the prefill deadline is PREFILL_TIMEOUT_S."""
    stack = start_stack(model, "disaggregated",
                        worker_arg=("--num-kv-blocks=512", "--max-num-batched-tokens=2"),
                        router_args=["--max-local-prefill-tokens=0", "--max-prefill-queue-s=1000"],
                        gateway_args=["--slos=", f"--prefill-timeout-s={PREFILL_TIMEOUT_S}"])
    yield stack
    stack.stop()


def _idle(stack: Stack) -> bool:
    """No blocks in use and no leases on any worker."""
    return all(metric(w, "baton_kv_cache_free_blocks") == metric(w, "baton_kv_cache_total_blocks")
               and metric(w, "baton_kv_leases") == 0 for w in stack.workers())


@pytest.mark.parametrize("stream", [True, False])
def test_leaving_during_prefill_frees_blocks_and_lease_at_once(stack, model, stream):
    wait_for(lambda: _idle(stack), timeout=30, what="an idle stack")
    body = {"model": model.name, "prompt": f"{stream} {LONG_PROMPT}", "max_tokens": 16,
            "temperature": 0, "stream": stream}
    prefill = stack.workers("prefill")[0]
    computed = metric(prefill, "baton_prompt_tokens_computed_total")
    # left while the prefill worker computes it
    asyncio.run(leave_once_running(stack.url, body, stack.workers("prefill")[0], poll_s=0.02))
    left = time.monotonic()
    # The gateway notices within 0.25 s; the lease would otherwise hold the blocks for 30 s.
    wait_for(lambda: _idle(stack), timeout=1.5, what="blocks and leases back")
    assert time.monotonic() - left < 1.5
    assert metric(prefill, "baton_num_requests_running") == 0
    # stopped part-way, not run to its end
    assert metric(prefill, "baton_prompt_tokens_computed_total") - computed < 1800


def test_a_stalled_prefill_worker_falls_back_to_local_prefill(stack, model):
    client = openai.OpenAI(base_url=stack.url, api_key="unused", max_retries=0, timeout=30)
    prompt = "The stalled worker story: once upon a time"

    def complete(**extra) -> str:
        return client.completions.create(model=model.name, prompt=prompt, max_tokens=24,
                                         temperature=0, extra_body=extra).choices[0].text

    prefill = stack.workers("prefill")[0]
    wait_for(lambda: _idle(stack), timeout=30, what="an idle stack")
    prefill.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        text = complete()
        elapsed = time.monotonic() - started
    finally:
        prefill.process.send_signal(signal.SIGCONT)
    assert PREFILL_TIMEOUT_S <= elapsed < PREFILL_TIMEOUT_S + 10, elapsed
    fallback = [line for line in stack.gateway.output if "prefilling on decode worker" in line]
    assert len(fallback) == 1 and "failed (DEADLINE_EXCEEDED" in fallback[0], fallback
    # The stalled worker drops the request it was given as soon as it runs again.
    wait_for(lambda: _idle(stack), timeout=10, what="blocks and leases back")
    # Undisturbed, and uncached everywhere (another salt): the same tokens.
    assert complete(cache_salt="undisturbed") == text
