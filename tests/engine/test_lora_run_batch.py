"""`baton run-batch` with LoRA adapters (vLLM's --enable-lora, --lora-modules, --max-loras,
--max-lora-rank): a line whose `model` names an adapter runs under it, in the same batches as the
base model's lines, token for token as the engine runs that adapter; the response names the
adapter; an adapter the flags refuse stops the command with the reason."""
from __future__ import annotations

import json

import pytest

from baton.services.cli.main import main
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from tests.engine.engine_helpers import random_prompts
from tests.engine.lora_helpers import make_adapters

NEW_TOKENS = 8
ENGINE = {"dtype": "float32", "num_kv_blocks": 128, "max_loras": 2, "max_lora_rank": 16}


@pytest.fixture(scope="module")
def adapters(tiny_model_dirs, tmp_path_factory):
    return make_adapters(tiny_model_dirs["llama"], tmp_path_factory.mktemp("batch-lora"))


def _run_batch(model_dir, tmp_path, items, *flags: str) -> list[dict] | int:
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps({"method": "POST", **item}) + "\n" for item in items))
    code = main(["run-batch", "-i", str(src), "-o", str(dst), "--model", str(model_dir),
                 "--dtype", "float32", "--num-kv-blocks", "128", *flags])
    return [json.loads(line) for line in dst.read_text().splitlines()] if code == 0 else code


def test_lines_naming_adapters_run_under_them(tiny_model_dirs, adapters, tmp_path) -> None:
    model_dir = tiny_model_dirs["llama"]
    modules = [f"{name}={adapters[name]}" for name in ("qv8", "mlp4rs")]
    prompts = random_prompts(2, 200, seed=8, min_len=5, max_len=30)
    names = ["qv8", "mlp4rs", "llama"]  # "llama": the base model's own name
    items = [{"custom_id": f"{name}-{i}", "url": "/v1/completions",
              "body": {"model": name, "prompt": prompt, "max_tokens": NEW_TOKENS,
                       "temperature": 0, "ignore_eos": True, "return_token_ids": True}}
             for i, prompt in enumerate(prompts) for name in names]
    lines = _run_batch(model_dir, tmp_path, items, "--enable-lora", "--lora-modules", *modules,
                       "--max-loras", "2", "--max-lora-rank", "16")
    got = {line["custom_id"]: line["response"]["body"] for line in lines}
    engine = LLMEngine(EngineConfig(model=str(model_dir), lora_modules=modules, **ENGINE))
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        for name in names:
            engine.add_request(f"{name}-{i}", prompt, params,
                               lora_name=None if name == "llama" else name)
    want = {}
    while engine.has_unfinished_requests():
        want.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    for custom_id, body in got.items():
        assert body["choices"][0]["token_ids"] == want[custom_id], custom_id
        assert body["model"] == custom_id.rsplit("-", 1)[0]
    assert len({tuple(want[f"{name}-0"]) for name in names}) == len(names), \
        "each adapter must change the outputs, or the test proves nothing"


def test_an_adapter_above_max_lora_rank_stops_the_command(tiny_model_dirs, adapters, tmp_path,
                                                          capsys) -> None:
    item = {"custom_id": "x", "url": "/v1/completions", "body": {"prompt": "hi", "max_tokens": 1}}
    code = _run_batch(tiny_model_dirs["llama"], tmp_path, [item],
                      "--lora-modules", f"all16={adapters['all16']}", "--max-lora-rank", "8")
    assert code == 2
    assert "LoRA rank 16 is above --max-lora-rank 8" in capsys.readouterr().err
