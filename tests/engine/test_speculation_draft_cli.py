"""`baton run-batch` with a draft model: greedy results are those without one, for two model
families; a draft that cannot serve the target is refused before anything runs."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from baton.services.checkpoints.tiny_model import TinyModelSpec, make_tiny_model
from baton.services.cli.main import main
from baton.services.engine.config import EngineConfig
from tests.engine.draft_helpers import perturbed_copy
from tests.engine.engine_helpers import random_prompts
from tests.engine.test_speculation_run_batch import FLAGS
from tests.engine.test_speculation_run_batch import run as run_batch


def draft_config(model, k: int = 3) -> str:
    return json.dumps({"method": "draft_model", "model": str(model), "num_speculative_tokens": k})


@pytest.fixture(scope="module")
def other_vocabulary(tmp_path_factory):
    """A checkpoint whose vocabulary is not the tiny models' 512 tokens."""
    return make_tiny_model(tmp_path_factory.mktemp("vocab") / "m",
                           TinyModelSpec.preset("llama", vocab_size=600))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_run_batch_with_a_draft_equals_no_speculation(tiny_model_dirs, tmp_path, arch):
    model = tiny_model_dirs[arch]
    draft = perturbed_copy(model, tmp_path / "draft", 0.03)
    prompts = random_prompts(3, vocab_size=500, seed=9, min_len=10, max_len=30)
    assert (run_batch(model, tmp_path, prompts, "--speculative-config", draft_config(draft))
            == run_batch(model, tmp_path, prompts))


def test_a_draft_of_another_vocabulary_is_refused(tiny_model_dirs, other_vocabulary, tmp_path,
                                                  capsys):
    target = tiny_model_dirs["llama"]
    with pytest.raises(ValidationError, match="vocabulary of 600 tokens, the target 512"):
        EngineConfig(model=str(target), speculative_config=draft_config(other_vocabulary))
    src = tmp_path / "in.jsonl"
    src.write_text("")
    argv = ["run-batch", "-i", str(src), "-o", str(tmp_path / "out.jsonl"), "--model",
            str(target), *FLAGS, "--speculative-config", draft_config(other_vocabulary)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "must share the target's tokenizer and vocabulary" in err and "Traceback" not in err


@pytest.mark.parametrize("k, message", [(0, "between 1 and 16"), (17, "between 1 and 16")])
def test_a_draft_length_out_of_range_is_refused(tiny_model_dirs, k, message):
    with pytest.raises(ValidationError, match=message):
        EngineConfig(model=str(tiny_model_dirs["llama"]),
                     speculative_config=draft_config(tiny_model_dirs["llama"], k))


def test_prompt_lookup_keys_are_refused_for_a_draft(tiny_model_dirs):
    spec = json.loads(draft_config(tiny_model_dirs["llama"]))
    with pytest.raises(ValidationError, match="prompt_lookup_max applies to method 'ngram'"):
        EngineConfig(speculative_config=json.dumps({**spec, "prompt_lookup_max": 3}))
