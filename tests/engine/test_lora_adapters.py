"""Reading PEFT adapters and the `--lora-modules` forms: every bad adapter is a LoRAError that
names what is wrong, before anything is served."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig

from baton.services.checkpoints.tiny_lora import make_tiny_lora
from baton.services.engine.config import EngineConfig
from baton.services.engine.lora.adapter import read_adapter
from baton.services.engine.lora.manager import LoRAManager
from baton.services.engine.lora.modules import LoRAError, LoRAModule, parse_lora_modules
from baton.services.engine.sequence import Sequence
from baton.services.common.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llama(tiny_model_dirs) -> tuple[Path, AutoConfig]:
    return tiny_model_dirs["llama"], AutoConfig.from_pretrained(str(tiny_model_dirs["llama"]))


def _adapter(llama, tmp_path: Path, **kwargs) -> Path:
    kwargs.setdefault("rank", 8)
    kwargs.setdefault("targets", ("q_proj", "down_proj"))
    return make_tiny_lora(llama[0], tmp_path / "a", seed=1, **kwargs)


def _edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "adapter_config.json").read_text())
    cfg.update(changes)
    (path / "adapter_config.json").write_text(json.dumps(cfg))


def test_reads_rank_scaling_and_targets(llama, tmp_path: Path) -> None:
    path = _adapter(llama, tmp_path, alpha=32)
    adapter = read_adapter("a", path, llama[1], max_rank=16)
    assert (adapter.rank, adapter.scaling) == (8, 4.0)
    assert adapter.target_modules == ["down_proj", "q_proj"]
    _edit_config(path, use_rslora=True)
    assert read_adapter("a", path, llama[1], max_rank=16).scaling == pytest.approx(32 / 8 ** 0.5)


@pytest.mark.parametrize("change,message", [
    (dict(r=32), "rank 32 is above --max-lora-rank 16"),
    (dict(target_modules=["q_proj", "c_attn"]), r"target modules \['c_attn'\]"),
    (dict(use_dora=True), "use_dora"),
    (dict(bias="all"), "bias"),
    (dict(peft_type="IA3"), "only LoRA"),
])
def test_bad_configs_are_refused(llama, tmp_path: Path, change: dict, message: str) -> None:
    path = _adapter(llama, tmp_path)
    _edit_config(path, **change)
    with pytest.raises(LoRAError, match=message):
        read_adapter("a", path, llama[1], max_rank=16)


def test_rank_above_max(llama, tmp_path: Path) -> None:
    with pytest.raises(LoRAError, match="above --max-lora-rank 16"):
        read_adapter("a", _adapter(llama, tmp_path, rank=32), llama[1], max_rank=16)


def test_adapter_of_another_base_model(llama, tiny_model_dirs, tmp_path: Path) -> None:
    other = make_tiny_lora(tiny_model_dirs["qwen3"], tmp_path / "q3", rank=4,
                           targets=("q_proj",), seed=2)
    with pytest.raises(LoRAError, match="another model"):
        read_adapter("q3", other, llama[1], max_rank=16)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "missing"])
def test_corrupt_safetensors(llama, tmp_path: Path, damage: str) -> None:
    path = _adapter(llama, tmp_path)
    file = path / "adapter_model.safetensors"
    data = file.read_bytes()
    if damage == "garbage":
        file.write_bytes(b"\x00\x01not a safetensors file" * 10)
    elif damage == "truncated":
        file.write_bytes(data[:len(data) // 2])
    else:
        file.unlink()
    with pytest.raises(LoRAError, match="corrupt or truncated|no adapter_model"):
        read_adapter("a", path, llama[1], max_rank=16)


def test_not_a_folder_or_no_config(llama, tmp_path: Path) -> None:
    with pytest.raises(LoRAError, match="not a folder"):
        read_adapter("a", tmp_path / "nowhere", llama[1], max_rank=16)
    (tmp_path / "empty").mkdir()
    with pytest.raises(LoRAError, match="no adapter_config.json"):
        read_adapter("a", tmp_path / "empty", llama[1], max_rank=16)


def test_module_forms() -> None:
    assert parse_lora_modules(["a=/x", '{"name": "b", "path": "/y", "base_model_name": "m"}']) == [
        LoRAModule("a", "/x"), LoRAModule("b", "/y", "m")]
    for bad in ["noequals", "=/x", '{"name": "b"}', "{not json", '{"name":"b","path":"p","x":1}']:
        with pytest.raises(LoRAError, match="--lora-modules"):
            parse_lora_modules([bad])
    with pytest.raises(LoRAError, match="given twice"):
        parse_lora_modules(["a=/x", "a=/y"])


def test_config_implies_enable_lora_and_checks_host_cache() -> None:
    assert EngineConfig(lora_modules=["a=/x"]).enable_lora
    with pytest.raises(ValueError, match="max_cpu_loras"):
        EngineConfig(max_loras=4, max_cpu_loras=2)


def test_manager_names_base_model_and_in_use(llama, tmp_path: Path) -> None:
    path = _adapter(llama, tmp_path)
    config = EngineConfig(model=str(llama[0]), lora_modules=[f"a={path}"], max_loras=1)
    manager = LoRAManager(config, llama[1], "base", None)
    with pytest.raises(LoRAError, match="has already been loaded"):
        manager.add(LoRAModule("a", str(path)))
    with pytest.raises(LoRAError, match="is the base model's"):
        manager.add(LoRAModule("base", str(path)))
    with pytest.raises(LoRAError, match="for base model 'other'"):
        manager.add(LoRAModule("b", str(path), "other"))
    seq = Sequence("r", [1, 2], SamplingParams(max_tokens=1), lora_name="a")
    assert manager.acquire(seq) and seq.lora_slot == 0
    with pytest.raises(LoRAError, match="in use by 1"):
        manager.remove("a")
    manager.release(seq)
    manager.remove("a")
    assert manager.stats().registered == []
