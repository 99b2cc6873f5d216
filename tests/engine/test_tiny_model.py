from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from baton.services.checkpoints.tiny_model import (ARCHS, TinyModelSpec, count_parameters,
                                                   embedded_model_path, make_tiny_model)

FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
         "chat_template.jinja", "generation_config.json")
TEXTS = ("Hello, world!", "  leading spaces,\ttabs\nand newlines  ", "café naïve résumé Ærøskøbing",
         "emoji 🦀🚀 and a family 👨‍👩‍👧", "你好，世界。日本語のテキスト", "<|im_start|> is special")


@pytest.fixture(params=ARCHS)
def model_dir(request: pytest.FixtureRequest, tiny_model_dirs: dict[str, Path]) -> Path:
    return tiny_model_dirs[request.param]


def test_checkpoint_files(model_dir: Path) -> None:
    for name in FILES:
        assert (model_dir / name).is_file(), name


def test_reload_gives_the_saved_weights(model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.dtype == torch.float32
    saved = load_file(model_dir / "model.safetensors")
    loaded = model.state_dict()
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name
    assert count_parameters(model_dir) == model.num_parameters()


def test_arch_shapes(tiny_model_dirs: dict[str, Path]) -> None:
    llama, qwen2, qwen3 = (AutoConfig.from_pretrained(tiny_model_dirs[a])
                           for a in ("llama", "qwen2", "qwen3"))
    assert llama.num_attention_heads > llama.num_key_value_heads
    assert qwen2.tie_word_embeddings
    assert "lm_head.weight" not in load_file(tiny_model_dirs["qwen2"] / "model.safetensors")
    assert qwen3.num_attention_heads & (qwen3.num_attention_heads - 1)  # not a power of two
    assert qwen3.num_attention_heads * qwen3.head_dim != qwen3.hidden_size


def test_special_token_ids_agree(model_dir: Path) -> None:
    config = AutoConfig.from_pretrained(model_dir)
    generation = GenerationConfig.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert (config.eos_token_id == generation.eos_token_id == tokenizer.eos_token_id ==
            tokenizer.pad_token_id)
    assert tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == "<|endoftext|>"
    assert (config.bos_token_id is None and generation.bos_token_id is None and
            tokenizer.bos_token_id is None)
    assert len(tokenizer) == config.vocab_size


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trips_utf8(tiny_model_dirs: dict[str, Path], text: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dirs["llama"])
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert "<|im_start|>" not in text or tokenizer.convert_tokens_to_ids("<|im_start|>") in ids


def test_chat_template(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\n")
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    assert encoded["input_ids"] == tokenizer.encode(text)
    parts = [{
        "role": "user", "content": [{"type": "text", "text": "Hi "},
                                    {"type": "text", "text": "there"}]
    }]
    assert tokenizer.apply_chat_template(parts,
                                         tokenize=False) == "<|im_start|>user\nHi there<|im_end|>\n"


def test_greedy_generation_varies(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    prompt = tokenizer("Once upon a time", return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    new = out[0, prompt["input_ids"].shape[1]:].tolist()
    assert len(new) == 16 and len(set(new)) > 4
    assert isinstance(tokenizer.decode(new), str)


def test_same_seed_same_files_other_seed_other_weights(tiny_model_dirs: dict[str, Path],
                                                       tmp_path: Path) -> None:
    original = tiny_model_dirs["qwen3"]
    again = make_tiny_model(tmp_path / "again", TinyModelSpec.preset("qwen3"))
    match, mismatch, errors = filecmp.cmpfiles(original, again, FILES, shallow=False)
    assert (mismatch, errors) == ([], [])
    other = make_tiny_model(tmp_path / "other", TinyModelSpec.preset("qwen3", seed=1))
    assert filecmp.cmp(original / "tokenizer.json", other / "tokenizer.json", shallow=False)
    a, b = load_file(original / "model.safetensors"), load_file(other / "model.safetensors")
    assert not torch.equal(a["model.embed_tokens.weight"], b["model.embed_tokens.weight"])


def test_larger_vocab_is_filled(tmp_path: Path) -> None:
    out = make_tiny_model(tmp_path, TinyModelSpec.preset("llama", vocab_size=4096, num_layers=1))
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == json.loads((out / "config.json").read_text())["vocab_size"] == 4096
    assert tokenizer.decode(tokenizer.encode(TEXTS[3])) == TEXTS[3]


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        TinyModelSpec.preset("llama", num_heads=3)
    with pytest.raises(ValueError):
        TinyModelSpec.preset("llama", vocab_size=100)
    assert TinyModelSpec.preset("llama", "bench").vocab_size == 4096


def test_embedded_model_is_made_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATON_CACHE_DIR", str(tmp_path))
    path = embedded_model_path()
    assert path == tmp_path / "models" / "tiny-llama"
    assert AutoConfig.from_pretrained(path).model_type == "llama"
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert embedded_model_path() == path and (path /
                                              "model.safetensors").stat().st_mtime_ns == stamp
    # no temp folder left behind
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny-llama"]
