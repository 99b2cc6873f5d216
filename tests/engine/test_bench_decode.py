"""`baton bench decode-step` on the tiny model: it runs pure decode steps and computes the floor it
prints."""
from __future__ import annotations

import argparse
import json

from baton.loadtest.bench.decode import weight_bytes_per_step
from baton.loadtest.commands import bench
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", "decode-step", *argv])
    return args.func(args)


def test_decode_step_rows_and_floor(tiny_model_dirs, tmp_path, capsys):
    model, out = tiny_model_dirs["llama"], tmp_path / "ds.json"
    assert _run([
        "--model",
        str(model), "--batch-sizes", "1,4", "--context", "40", "--steps", "3", "--warmup", "1",
        "--bandwidth-gbps", "100", "--output-json",
        str(out)
    ]) == 0
    doc = json.loads(out.read_text())
    assert [(r["batch"], r["context"], r["steps"]) for r in doc["rows"]] == [(1, 40, 3), (4, 40, 3)]
    engine = LLMEngine(EngineConfig(model=str(model), num_kv_blocks=16))
    weights = weight_bytes_per_step(engine.runner.model)
    assert doc["weight_bytes_per_step"] == weights
    config = engine.model_config
    head_dim = config.hidden_size // config.num_attention_heads
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4
    assert doc["kv_bytes_per_token"] == kv
    for row in doc["rows"]:
        floor_ms = (weights + row["batch"] * row["context"] * kv) / 100e9 * 1e3
        assert abs(row["floor_ms"] - floor_ms) < 1e-9
        assert abs(row["ratio_to_floor"] -
                   row["median_ms"] / row["floor_ms"]) < 1e-9 * row["ratio_to_floor"]
    assert "x floor" in capsys.readouterr().out


def test_decode_step_floor_is_na_on_cpu_without_bandwidth(tiny_model_dirs, capsys):
    assert _run([
        "--model",
        str(tiny_model_dirs["llama"]), "--device", "cpu", "--batch-sizes", "2", "--context", "8",
        "--steps", "1", "--warmup", "0"
    ]) == 0
    assert "n/a" in capsys.readouterr().out


def test_decode_step_that_cannot_fit_says_why(tiny_model_dirs, capsys):
    assert _run(["--model", str(tiny_model_dirs["llama"]), "--batch-sizes", "4", "--context", "64",
                 "--num-kv-blocks", "8"]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "8 blocks" in err
