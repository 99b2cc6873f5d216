"""`baton bench throughput` and the workload builders behind it."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from baton.loadtest.traces import TRACES_DIR_ENV, TraceRequest, default_traces_dir, read_trace
from baton.loadtest.workloads import (RESERVED_TAIL, random_workload, shared_prefix_workload,
                                      token_pool, trace_requests, trace_workload)
from baton.loadtest.commands import bench

VOCAB = 512
AVOID = {0, 1, 2}


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_random_workload_is_seeded_and_in_range():
    # The headline benchmark's shape: inputs 32-256, outputs 16-256.
    make = lambda seed: random_workload(300, 144, 136, (0.7778, 0.8824), VOCAB, seed, AVOID)
    requests = make(0)
    assert requests == make(0) and requests != make(1)
    in_lens, out_lens = [len(p) for p, _ in requests], [n for _, n in requests]
    assert min(in_lens) >= 32 and max(in_lens) <= 256 and min(out_lens) >= 16 and max(
        out_lens) <= 256
    # Uniform over the range: 300 draws reach close to both ends.
    assert min(in_lens) < 40 and max(in_lens) > 248
    tokens = {t for p, _ in requests for t in p}
    assert not tokens & AVOID and max(tokens) < VOCAB - RESERVED_TAIL


def test_zero_range_ratio_gives_fixed_lengths():
    requests = random_workload(5, 20, 7, 0.0, VOCAB, seed=3)
    assert {len(p) for p, _ in requests} == {20} and {n for _, n in requests} == {7}


def test_bad_range_ratio_is_refused():
    with pytest.raises(ValueError, match="range_ratio"):
        random_workload(2, 10, 10, 1.5, VOCAB)


def test_shared_prefix_prompts_share_exactly_the_prefix():
    requests = shared_prefix_workload(10, 48, 20, 5, 0.5, VOCAB, seed=0, avoid=AVOID)
    prompts = [p for p, _ in requests]
    assert requests == shared_prefix_workload(10, 48, 20, 5, 0.5, VOCAB, seed=0, avoid=AVOID)
    assert all(p[:48] == prompts[0][:48] for p in prompts)
    assert len({p[48] for p in prompts}) > 1  # no more than the prefix is common to all
    assert all(10 <= len(p) - 48 <= 30 for p in prompts)


def test_mooncake_hash_ids_become_shared_token_blocks():
    # scale 16: 32-token blocks. a and b share 2 leading hash ids, a and c none; d repeats a's first
    # id later.
    rows = [
        TraceRequest(0.0, 4 * 512, 160, (1, 2, 3, 4)),
        TraceRequest(0.0, 3 * 512 - 100, 16, (1, 2, 9)),
        TraceRequest(0.0, 512, 16, (5, )),
        TraceRequest(0.0, 1024, 16, (6, 1))
    ]
    (a, a_out), (b, _), (c, _), (d, _) = trace_requests(rows, 4, 16, token_pool(VOCAB, AVOID),
                                                        seed=0)
    assert (len(a), len(b), len(c), a_out) == (128, 90, 32, 10)  # every length divided by the scale
    assert _common_prefix(a, b) == 2 * 32
    assert _common_prefix(a, c) == 0
    assert d[32:] == a[:32]  # a hash id maps to the same block wherever it appears


def test_mooncake_scale_must_divide_the_block():
    rows = [TraceRequest(0.0, 512, 1, (1,))]
    with pytest.raises(ValueError, match="divides 512"):
        trace_requests(rows, 1, 3, token_pool(VOCAB))


def test_traces_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(TRACES_DIR_ENV, str(tmp_path))
    assert default_traces_dir() == tmp_path
    with pytest.raises(FileNotFoundError, match=TRACES_DIR_ENV):
        read_trace("azure-code")


@pytest.mark.skipif(not default_traces_dir().is_dir(),
                    reason="the public traces are not checked out")
def test_real_mooncake_trace_keeps_its_prefix_structure():
    n, scale, block = 40, 16, 32
    rows = read_trace("mooncake-conv", limit=n)
    requests = trace_workload("mooncake-conv", n, scale, VOCAB, seed=0, avoid=AVOID)
    assert requests == trace_workload("mooncake-conv", n, scale, VOCAB, seed=0, avoid=AVOID)
    for i in range(n):
        for j in range(i + 1, n):
            k = _common_prefix(list(rows[i].hash_ids), list(rows[j].hash_ids))
            (p, _), (q, _) = requests[i], requests[j]
            shared = _common_prefix(p, q)
            assert shared >= min(k * block, len(p), len(q))
            if k * block < min(len(p), len(q)):
                assert shared < (k + 1) * block  # the next block differs


@pytest.mark.skipif(not default_traces_dir().is_dir(),
                    reason="the public traces are not checked out")
def test_azure_trace_lengths_are_scaled():
    rows = read_trace("azure-conv", limit=8)
    requests = trace_workload("azure-conv", 8, 8, VOCAB, seed=0)
    assert [len(p) for p, _ in requests] == [max(1, round(r.input_len / 8)) for r in rows]
    assert [n for _, n in requests] == [max(1, round(r.output_len / 8)) for r in rows]


def _bench(model_dir: Path, out: Path, *flags: str) -> dict:
    parser = argparse.ArgumentParser(prog="baton")
    bench.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["bench", "throughput", "--model",
         str(model_dir), "--output-json",
         str(out), *flags])
    assert args.func(args) == 0
    return json.loads(out.read_text())


def _assert_positive_figures(result: dict) -> None:
    for name in ("requests_per_s", "total_tokens_per_s", "output_tokens_per_s", "elapsed_s"):
        assert result[name] > 0, name


def test_throughput_writes_a_complete_report(tiny_model_dirs, tmp_path, capsys):
    doc = _bench(tiny_model_dirs["llama"], tmp_path / "r.json", "--num-prompts", "6", "--input-len",
                 "24", "--output-len", "6", "--range-ratio", "0.5")
    baton = doc["results"]["baton"]
    _assert_positive_figures(baton)
    assert baton["num_requests"] == 6 and baton["output_tokens"] == doc["workload"]["output_tokens"]
    assert baton["prompt_tokens"] == doc["workload"]["prompt_tokens"] == baton[
        "prefix_cache_queries"]
    assert doc["machine"]["cpu_count"] >= 1 and doc["machine"]["torch"] and doc["machine"]["date"]
    assert doc["args"]["num_prompts"] == 6 and "command" in doc
    assert "output tok/s" in capsys.readouterr().out


def test_compare_hf_runs_the_same_work(tiny_model_dirs, tmp_path, capsys):
    doc = _bench(tiny_model_dirs["llama"], tmp_path / "r.json", "--num-prompts", "4", "--input-len",
                 "24", "--output-len", "6", "--range-ratio", "0.5", "--compare", "hf")
    baton, hf = doc["results"]["baton"], doc["results"]["hf"]
    _assert_positive_figures(baton)
    _assert_positive_figures(hf)
    assert (hf["prompt_tokens"], hf["output_tokens"]) == (baton["prompt_tokens"],
                                                          baton["output_tokens"])
    assert hf["settings"]["num_blocks"] == baton["settings"]["num_kv_blocks"]
    assert all(v > 0 for v in doc["ratio_baton_over_hf"].values())
    assert "baton/hf" in capsys.readouterr().out


def test_shared_prefix_is_served_from_the_prefix_cache(tiny_model_dirs, tmp_path):
    n, prefix, block = 6, 64, 16
    # A step budget of exactly the prefix keeps the first request alone in the first step, so every
    # later request finds the whole prefix cached.
    doc = _bench(tiny_model_dirs["llama"], tmp_path / "r.json", "--workload", "shared-prefix",
                 "--num-prompts", str(n), "--prefix-len", str(prefix), "--input-len",
                 "16", "--output-len", "4", "--range-ratio", "0.5", "--max-num-batched-tokens",
                 str(prefix), "--block-size", str(block))
    baton = doc["results"]["baton"]
    assert baton["prefix_cache_hits"] >= (n - 1) * (prefix // block * block)
    assert baton["preemptions"] == 0
    assert baton["prompt_tokens_computed"] == baton["prompt_tokens"] - baton["prefix_cache_hits"]
    assert np.isclose(baton["prefix_hit_ratio"],
                      baton["prefix_cache_hits"] / baton["prompt_tokens"])


def test_json_schema_runs_constrained_then_free_at_the_same_lengths(tiny_model_dirs, tmp_path,
                                                                    capsys):
    schema = tmp_path / "schema.json"
    schema.write_text(
        json.dumps({
            "type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["n"], "additionalProperties": False
        }))
    doc = _bench(tiny_model_dirs["llama"], tmp_path / "r.json", "--num-prompts", "4", "--input-len",
                 "24", "--output-len", "30", "--range-ratio", "0.2", "--json-schema", str(schema))
    constrained, free = doc["results"]["baton+json"], doc["results"]["baton"]
    _assert_positive_figures(constrained)
    _assert_positive_figures(free)
    # {"n":NN} ends well inside the budget, and the free run generates exactly as much.
    assert constrained["output_tokens"] == free["output_tokens"] < doc["workload"]["output_tokens"]
    assert constrained["settings"]["structured_output"] == "json_schema"
    assert "ratio_baton+json_over_baton" in doc
    assert "baton+json/baton" in capsys.readouterr().out


def test_json_schema_that_does_not_compile_is_refused(tiny_model_dirs, tmp_path, capsys):
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "frobnicate"}')
    parser = argparse.ArgumentParser(prog="baton")
    bench.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([
        "bench", "throughput", "--model",
        str(tiny_model_dirs["llama"]), "--json-schema",
        str(schema)
    ])
    assert args.func(args) == 2
    assert "structured_output" in capsys.readouterr().err
