"""`baton bench spec` on tiny models: rows for every workload and batch, outputs identical with
and without speculation, drafts counted; the copy model's trainer writes a loadable checkpoint."""
from __future__ import annotations

import argparse
import json

from baton.loadtest.bench.copy_model import IGNORE, Recipe, cached_copy_model, repeat_batch
from baton.loadtest.bench.spec import prompts
from baton.loadtest.commands import bench
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine

import torch


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", "spec", *argv])
    return args.func(args)


def test_bench_spec_rows(tiny_model_dirs, tmp_path, capsys):
    out = tmp_path / "spec.json"
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}'
    assert _run(["--model", str(tiny_model_dirs["llama"]), "--batch-sizes", "1,3",
                 "--prompt-len", "24", "--output-len", "24", "--repeats", "1", "--spec", spec,
                 "--output-json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["workload"], r["batch"]) for r in rows] == [
        ("repeat", 1), ("repeat", 3), ("random", 1), ("random", 3)]
    assert all(r["identical"] and r["tpot_ms_on"] > 0 and r["tokens_per_s_off"] > 0 for r in rows)
    # With one-token lookups over a 512-token vocabulary, some step finds a match to draft.
    assert sum(r["drafts_per_request"] for r in rows) > 0
    assert "TPOT ms off" in capsys.readouterr().out


def test_bench_spec_refuses_a_bad_config(tiny_model_dirs, capsys):
    assert _run(["--model", str(tiny_model_dirs["llama"]), "--spec",
                 '{"method": "ngram", "num_speculative_tokens": 99}']) == 2
    assert "between 1 and 16" in capsys.readouterr().err


def test_workloads_repeat_or_not():
    repeat, random = prompts("repeat", 2, 60, 512, 0), prompts("random", 2, 60, 512, 0)
    assert all(len(p) == 60 for p in repeat + random)
    assert all(len(set(p)) <= 24 for p in repeat)
    assert all(len(set(p)) > 40 for p in random)
    rows, labels = repeat_batch(3, 80, 512, torch.Generator().manual_seed(0))
    assert rows.shape == labels.shape == (3, 80)
    for row, label in zip(rows.tolist(), labels.tolist()):
        span = label.count(IGNORE)
        assert 8 <= span <= 32 and label[:span] == [IGNORE] * span and label[span:] == row[span:]
        assert row[span:] == (row[:span] * 80)[:80 - span]


def test_copy_model_is_trained_once_into_a_checkpoint_the_engine_serves(tmp_path):
    recipe = Recipe(max_steps=2, batch=2, length=32)
    model = cached_copy_model(recipe, tmp_path)
    weights = (model / "model.safetensors").stat().st_mtime_ns
    assert cached_copy_model(recipe, tmp_path) == model
    assert (model / "model.safetensors").stat().st_mtime_ns == weights
    assert [p.name for p in tmp_path.iterdir()] == [model.name]  # no scratch folder left
    engine = LLMEngine(EngineConfig(model=str(model), num_kv_blocks=16))
    out = engine.generate([[400, 401, 402]], SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(out[0].token_ids) == 3
