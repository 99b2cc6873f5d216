"""The GPU-check kit (deploy/gpu-check/, issue 32) runs only on a lent GPU, so it can rot between
sessions unseen (a moved import once cost a whole session's decode figures): its checkpoint maker
and its step script are checked here on CPU."""
from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer

from baton.services.engine.models.loader import checkpoint_files

KIT = Path(__file__).resolve().parents[2] / "deploy" / "gpu-check"


def _make8b():
    spec = importlib.util.spec_from_file_location("make8b", KIT / "make8b.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make8b_writes_a_checkpoint_the_engine_reads(tmp_path: Path) -> None:
    small = dict(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    out = _make8b().build(tmp_path / "m", device="cpu", **small)
    config = AutoConfig.from_pretrained(out)
    assert (config.num_hidden_layers, config.num_key_value_heads, config.vocab_size) == (2, 2, 2048)
    assert str(config.dtype).endswith("bfloat16")
    assert len(AutoTokenizer.from_pretrained(out)) == 2048
    assert [p.suffix for p in checkpoint_files(out)] == [".safetensors"]


def test_eight_b_shape_is_llama_3_1_8b() -> None:
    shape = _make8b().LLAMA_8B
    assert (shape["hidden_size"], shape["num_hidden_layers"], shape["num_key_value_heads"],
            shape["vocab_size"]) == (4096, 32, 8, 128256)


def test_every_step_of_all_sh_is_defined_and_costed() -> None:
    script = (KIT / "all.sh").read_text()
    subprocess.run(["bash", "-n", str(KIT / "all.sh")], check=True)
    steps = re.search(r'STEPS=\$\{GPU_CHECK_STEPS:-"([^"]+)"\}', script).group(1).split()
    costs = dict(re.findall(r"\[(\w+)\]=(\d+)", script))
    for step in steps:
        assert re.search(rf"^{step}\(\) {{", script, re.M), f"step {step} has no function"
        assert step in costs, f"step {step} has no COST"
    for path in re.findall(r"python3 ((?:docs|deploy)/[\w/.-]+\.py)", script):
        assert (KIT.parents[1] / path).is_file(), path
