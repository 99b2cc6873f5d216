"""Greedy outputs of `baton run-batch` against transformers' `generate` on the same checkpoints
(float32, CPU).

A prompt may differ only where transformers itself nearly ties: its two best logits within 1e-4.
"""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from baton.services.cli.main import main
from tests.engine.engine_helpers import random_prompts

NUM_PROMPTS = 64
NEW_TOKENS = 32
TIE_GAP = 1e-4


def run_batch(model_dir, prompts, tmp_path) -> list[list[int]]:
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    with src.open("w") as f:
        for i, p in enumerate(prompts):
            body = {
                "model": "m", "prompt": p, "max_tokens": NEW_TOKENS, "temperature": 0,
                "return_token_ids": True
            }
            f.write(
                json.dumps({
                    "custom_id": f"p{i}", "method": "POST", "url": "/v1/completions", "body": body
                }) + "\n")
    assert main([
        "run-batch", "-i",
        str(src), "-o",
        str(dst), "--model",
        str(model_dir), "--dtype", "float32"
    ]) == 0
    lines = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == [f"p{i}" for i in range(len(prompts))]
    return [line["response"]["body"]["choices"][0]["token_ids"] for line in lines]


def top2_gap(model, tokens: list[int]) -> float:
    with torch.no_grad():
        top = model(torch.tensor([tokens])).logits[0, -1].float().topk(2).values
    return float(top[0] - top[1])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_matches_transformers(arch, tiny_model_dirs, tmp_path):
    model_dir = tiny_model_dirs[arch]
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    special = frozenset(hf.generation_config.eos_token_id if isinstance(
        hf.generation_config.eos_token_id, list) else [hf.generation_config.eos_token_id])
    seed = {"llama": 1, "qwen2": 2, "qwen3": 3}[arch]
    prompts = random_prompts(NUM_PROMPTS, hf.config.vocab_size, seed=seed, min_len=2, max_len=120,
                             avoid=special)
    ours = run_batch(model_dir, prompts, tmp_path)
    exact, gaps = 0, []
    for prompt, got in zip(prompts, ours):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                              do_sample=False)[0, len(prompt):]
        ref = ref.tolist()
        if got == ref:
            exact += 1
            continue
        first = min(len(got), len(ref))
        if got[:len(ref)] != ref[:len(got)]:
            first = next(i for i, (a, b) in enumerate(zip(got, ref)) if a != b)
        gaps.append(top2_gap(hf, prompt + ref[:first]))
    print(f"{arch}: {exact}/{NUM_PROMPTS} exact; top-2 logit gaps at divergences: {gaps}")
    assert exact >= 0.95 * NUM_PROMPTS
    assert all(g < TIE_GAP for g in gaps), gaps
