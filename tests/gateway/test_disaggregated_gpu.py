"""On one GPU: `baton serve --mode disaggregated` (a prefill and a decode worker sharing the device,
each with its memory share) answers greedy requests token for token as the colocated stack does,
through the official openai client, and the decode worker really read the prompt's KV (it did not
recompute it).

Skipped without CUDA. BATON_GPU_CHECK_MODEL names a checkpoint (e.g. the 8B-shaped one from
deploy/gpu-check/make8b.py; default: the tiny test model) and BATON_GPU_CHECK_PROMPT_WORDS the long
prompt's length in words (default 1000 for a real checkpoint, 48 for the tiny one; its token count
is printed). The hand-off figures are printed (-s)."""
from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest
import torch

from tests.launcher import Stack, metric, start_stack

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
]
MAX_TOKENS = 24


def _model(tiny_model_dirs: dict[str, Path]) -> tuple[Path, int]:
    chosen = os.environ.get("BATON_GPU_CHECK_MODEL")
    model = Path(chosen) if chosen else tiny_model_dirs["llama"]
    words = int(os.environ.get("BATON_GPU_CHECK_PROMPT_WORDS", "1000" if chosen else "48"))
    return model, words


def _prompts(words: int) -> list[str]:
    long = " ".join(f"w{i % 97}" for i in range(words))
    return ["Once upon a time there was", "The capital of France is", long]


def _answers(stack: Stack, model: Path, prompts: list[str]) -> list[list[str]]:
    client = openai.OpenAI(base_url=stack.url, api_key="unused", max_retries=0, timeout=300)
    answers = []
    for prompt in prompts:
        done = client.completions.create(model=model.name, prompt=prompt, max_tokens=MAX_TOKENS,
                                         temperature=0, logprobs=1)
        answers.append(done.choices[0].logprobs.tokens)
    print(f"\nlongest prompt: {done.usage.prompt_tokens} tokens")
    return answers


@pytest.mark.parametrize("kv_transport", ["nixl", "cuda_ipc"])
def test_disaggregated_on_one_gpu_matches_colocated(kv_transport: str,
                                                    tiny_model_dirs: dict[str, Path]) -> None:
    model, words = _model(tiny_model_dirs)
    prompts = _prompts(words)
    blocks = ("--num-kv-blocks=1024",)
    colocated = start_stack(model, "colocated", kv_transport=kv_transport, worker_arg=blocks)
    try:
        expected = _answers(colocated, model, prompts)
    finally:
        colocated.stop()
    # every prompt is handed off: the router would prefill these short ones on the decode worker
    stack = start_stack(model, "disaggregated", kv_transport=kv_transport, worker_arg=blocks,
                        router_args=["--max-local-prefill-tokens=0"])
    try:
        got = _answers(stack, model, prompts)
        (decode,) = stack.workers("decode")
        moved = metric(decode, "baton_kv_transfer_bytes_total")
        reads = metric(decode, "baton_kv_transfer_duration_seconds_count")
        seconds = metric(decode, "baton_kv_transfer_duration_seconds_sum")
        failures = metric(decode, "baton_kv_transfer_failures_total")
    finally:
        stack.stop()
    print(
        f"\n{kv_transport}: {reads:.0f} KV reads, {moved / 1e6:.1f} MB, mean "
        f"{seconds / max(reads, 1) * 1e3:.2f} ms "
        f"per read, {failures:.0f} failures")
    assert got == expected
    assert reads >= 1 and moved > 0 and failures == 0
