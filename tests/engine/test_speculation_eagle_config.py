"""EAGLE heads that cannot serve their target are refused with the reason, before anything runs
where the config.json tells (`baton run-batch` exits 2), else when the head loads; both published
weight files load; `baton run-batch` with a head decodes as without one."""
from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file, save_file

from baton.services.cli.main import main
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.speculation.config import SpeculativeConfigError
from tests.engine.eagle_helpers import WEIGHTS, head_config, make_head
from tests.engine.engine_helpers import random_prompts
from tests.engine.test_speculation_run_batch import FLAGS
from tests.engine.test_speculation_run_batch import run as run_batch


def spec(head, method: str = "eagle3", k: int = 2) -> str:
    return json.dumps({"method": method, "model": str(head), "num_speculative_tokens": k})


def engine_with(target, head, method: str = "eagle3") -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(target), num_kv_blocks=64, block_size=4,
                                  speculative_config=spec(head, method)))


def rewrite(head, **changes) -> None:
    """The head's weights with tensors replaced (a None value removes one)."""
    w = load_file(head / WEIGHTS)
    for name, value in changes.items():
        w.pop(name) if value is None else w.__setitem__(name, value)
    save_file(w, head / WEIGHTS, metadata={"format": "pt"})


@pytest.mark.parametrize("overrides, message", [
    ({"hidden_size": 32}, "has hidden_size 32, the target 64"),
    ({"vocab_size": 600}, "has a vocabulary of 600 tokens, the target 512"),
    ({"num_hidden_layers": 2}, "has 2 layers; EAGLE heads have one"),
    ({"draft_vocab_size": 1000}, "draft_vocab_size 1000, not between 1 and the target's 512"),
    ({"eagle_aux_hidden_state_layer_ids": [0, 1, 5]}, "fuses three of the target's 2 layers"),
])
def test_a_head_that_does_not_fit_the_target_is_refused_up_front(
        tiny_model_dirs, tmp_path, overrides, message):
    head = tmp_path / "head"
    head.mkdir()
    # Only the config is read before anything loads: it alone is written.
    (head / "config.json").write_text(json.dumps(
        head_config(tiny_model_dirs["llama"], True, **overrides)))
    with pytest.raises(ValidationError, match=message):
        EngineConfig(model=str(tiny_model_dirs["llama"]), speculative_config=spec(head))


@pytest.mark.parametrize("k", [0, 17])
def test_a_draft_length_out_of_range_is_refused(tiny_model_dirs, tmp_path, k):
    head = make_head(tiny_model_dirs["llama"], tmp_path / "head", False)
    with pytest.raises(ValidationError, match="between 1 and 16"):
        EngineConfig(model=str(tiny_model_dirs["llama"]), speculative_config=spec(head, "eagle", k))


def test_a_folder_without_a_config_is_refused(tmp_path):
    with pytest.raises(ValidationError, match="eagle head '/no/head' is not a checkpoint folder"):
        EngineConfig(speculative_config=spec("/no/head", "eagle"))


@pytest.mark.parametrize("change, message", [
    ({WEIGHTS: None}, "has no weights (looked for model.safetensors or pytorch_model.bin)"),
    ({"fc.weight": None}, "lacks tensors for: ['fc.weight']"),
    ({"fc.weight": torch.zeros(64, 64)}, "fc.weight has shape (64, 64); the model expects"),
    ({"d2t": torch.zeros(7, dtype=torch.long)}, "d2t has shape (7,), expected (256,)"),
    ({"d2t": torch.zeros(256, dtype=torch.long) + 300}, "outside the target's vocabulary"),
])
def test_a_head_whose_weights_do_not_load_is_refused(tiny_model_dirs, tmp_path, change,
                                                     message):
    target = tiny_model_dirs["llama"]
    head = make_head(target, tmp_path / "head", True)
    if WEIGHTS in change:
        (head / WEIGHTS).unlink()
    else:
        rewrite(head, **change)
    with pytest.raises(SpeculativeConfigError) as err:
        engine_with(target, head)
    assert message in str(err.value) and str(head) in str(err.value)


def test_both_published_weight_files_load_alike(tiny_model_dirs, tmp_path):
    target = tiny_model_dirs["llama"]
    head = make_head(target, tmp_path / "head", True)
    from_safetensors = engine_with(target, head).speculator.proposer.runner.head.state_dict()
    torch.save(load_file(head / WEIGHTS), head / "pytorch_model.bin")
    (head / WEIGHTS).unlink()
    from_bin = engine_with(target, head).speculator.proposer.runner.head.state_dict()
    assert from_bin.keys() == from_safetensors.keys()
    assert all(torch.equal(from_bin[k], from_safetensors[k]) for k in from_bin)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_run_batch_with_a_head_equals_no_speculation(tiny_model_dirs, tmp_path, method):
    model = tiny_model_dirs["qwen3"]
    head = make_head(model, tmp_path / "head", method == "eagle3")
    base = random_prompts(3, vocab_size=500, seed=9, min_len=10, max_len=30)
    prompts = base + [p + p for p in base]
    assert (run_batch(model, tmp_path, prompts, "--speculative-config", spec(head, method, 3))
            == run_batch(model, tmp_path, prompts))


@pytest.mark.parametrize("hidden, weights, message", [
    (32, True, "has hidden_size 32, the target 64"),  # refused by the settings
    (64, False, "has no weights"),  # refused where the head loads
])
def test_run_batch_refuses_a_head_that_cannot_serve(tiny_model_dirs, tmp_path, capsys, hidden,
                                                      weights, message):
    target = tiny_model_dirs["llama"]
    head = make_head(target, tmp_path / "head", False, hidden_size=hidden)
    if not weights:
        (head / WEIGHTS).unlink()
    src = tmp_path / "in.jsonl"
    src.write_text("")
    argv = ["run-batch", "-i", str(src), "-o", str(tmp_path / "out.jsonl"), "--model",
            str(target), *FLAGS, "--speculative-config", spec(head, "eagle")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_worker_refuses_a_head_that_cannot_serve(tiny_model_dirs, tmp_path):
    target = tiny_model_dirs["llama"]
    head = make_head(target, tmp_path / "head", False)
    (head / WEIGHTS).unlink()
    argv = ["worker", "--model", str(target), *FLAGS, "--host", "127.0.0.1", "--port", "0",
            "--speculative-config", spec(head, "eagle")]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert str(exited.value).startswith("baton worker: ") and "has no weights" in str(exited.value)
