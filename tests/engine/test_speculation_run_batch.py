"""`baton run-batch --speculative-config`: greedy results are those without it, token for token;
a bad config is refused before anything runs."""
from __future__ import annotations

import json

from baton.services.cli.main import main
from tests.engine.engine_helpers import random_prompts

FLAGS = ["--dtype", "float32", "--device", "cpu", "--num-kv-blocks", "128"]
SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}'


def run(model, tmp_path, prompts, *flags) -> list[list[int]]:
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({
        "custom_id": str(i), "method": "POST", "url": "/v1/completions",
        "body": {"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
                 "return_token_ids": True}}) + "\n" for i, p in enumerate(prompts)))
    assert main(["run-batch", "-i", str(src), "-o", str(dst), "--model", str(model), *FLAGS,
                 *flags]) == 0
    lines = [json.loads(line) for line in dst.read_text().splitlines()]
    return [line["response"]["body"]["choices"][0]["token_ids"] for line in lines]


def test_run_batch_greedy_equals_no_speculation(tiny_model_dirs, tmp_path):
    model = tiny_model_dirs["qwen2"]
    base = random_prompts(3, vocab_size=500, seed=9, min_len=10, max_len=30)
    prompts = base + [p + p for p in base]
    assert (run(model, tmp_path, prompts, "--speculative-config", SPEC)
            == run(model, tmp_path, prompts))


def test_run_batch_refuses_a_bad_config(tiny_model_dirs, tmp_path, capsys):
    bad = '{"method": "medusa", "model": "x", "num_speculative_tokens": 2}'
    src = tmp_path / "in.jsonl"
    src.write_text("")
    argv = ["run-batch", "-i", str(src), "-o", str(tmp_path / "out.jsonl"), "--model",
            str(tiny_model_dirs["qwen2"]), *FLAGS, "--speculative-config", bad]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "speculative_config" in err and "method 'medusa' is not supported" in err
    assert "Traceback" not in err
