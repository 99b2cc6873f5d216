"""`baton bench lora` on the tiny model: a row for the base model and each adapter count, each
from a batch of the asked size, the ratios against the base row."""
from __future__ import annotations

import argparse
import json

from baton.loadtest.commands import bench


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", "lora", *argv])
    return args.func(args)


def test_lora_rows(tiny_model_dirs, tmp_path, capsys) -> None:
    out = tmp_path / "lora.json"
    assert _run(["--model", str(tiny_model_dirs["llama"]), "--adapters", "1,3", "--batch", "4",
                 "--context", "20", "--steps", "2", "--warmup", "1", "--rounds", "1",
                 "--rank", "4", "--num-kv-blocks", "64", "--output-json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["adapters"], r["batch"], r["steps"]) for r in rows] == [(0, 4, 2), (1, 4, 2),
                                                                      (3, 4, 2)]
    assert rows[0]["vs_base"] == 1.0
    for row in rows[1:]:
        assert row["vs_base"] == row["median_ms"] / rows[0]["median_ms"]
    assert "x base" in capsys.readouterr().out


def test_bad_counts_are_refused(tiny_model_dirs, capsys) -> None:
    assert _run(["--model", str(tiny_model_dirs["llama"]), "--adapters", "8",
                 "--batch", "4"]) == 2
    assert "adapter counts" in capsys.readouterr().err
