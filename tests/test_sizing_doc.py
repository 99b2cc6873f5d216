"""docs/sizing.md and docs/multi-node.md carry the tables docs/sizing.py computes, exactly; the
script's model arithmetic agrees with a real Llama built by transformers and with the engine's own
block size; the figures the pages' prose quotes follow from the tables."""
from __future__ import annotations

import re
import runpy
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from baton.services.engine.kv.kv_cache import block_bytes

DOCS = Path(__file__).resolve().parents[1] / "docs"
SIZING: dict[str, Any] = runpy.run_path(str(DOCS / "sizing.py"))
MODEL = SIZING["LLAMA_3_70B"]
PAGES = {"model": "sizing.md", "memory": "sizing.md", "speed": "sizing.md", "pools": "sizing.md",
         "network": "multi-node.md"}


def config() -> LlamaConfig:
    return LlamaConfig(hidden_size=MODEL.hidden, intermediate_size=MODEL.intermediate,
                       num_hidden_layers=MODEL.layers, num_attention_heads=MODEL.heads,
                       num_key_value_heads=MODEL.kv_heads, head_dim=MODEL.head_dim,
                       vocab_size=MODEL.vocab, tie_word_embeddings=False)


@pytest.mark.parametrize("name", PAGES)
def test_the_page_carries_the_computed_table(name: str) -> None:
    text = (DOCS / PAGES[name]).read_text()
    found = re.search(rf"<!-- sizing:{name} -->\n(.*?)\n<!-- /sizing:{name} -->", text, re.S)
    assert found, f"no sizing:{name} table in docs/{PAGES[name]}"
    assert found.group(1) == SIZING["tables"]()[name], (
        f"docs/{PAGES[name]}'s {name} table differs: run python3 docs/sizing.py")


def test_parameters_are_those_of_a_real_llama_3_70b() -> None:
    with torch.device("meta"):
        model = LlamaForCausalLM(config())
    assert sum(SIZING["parameters"](MODEL).values()) == sum(p.numel() for p in model.parameters())


def test_kv_per_token_is_the_engines() -> None:
    per_token = SIZING["kv_bytes_per_token_per_rank"](MODEL, 1)
    assert per_token * 16 == block_bytes(config(), 16, torch.bfloat16) == 5 << 20
    # KV heads split while they last, then replicate: TP 16 keeps TP 8's per-rank share.
    assert SIZING["kv_bytes_per_token_per_rank"](MODEL, 8) == per_token // 8 == \
        SIZING["kv_bytes_per_token_per_rank"](MODEL, 16)


def test_ranks_together_hold_the_weights_once_while_kv_heads_split() -> None:
    """Only the norms are on every rank, while there are at least as many KV heads as ranks."""
    parameters = SIZING["parameters"](MODEL)
    total = sum(parameters.values()) * MODEL.dtype_bytes
    for tp in (2, 4, 8):
        held = SIZING["weight_bytes_per_rank"](MODEL, tp) * tp
        assert held == total + (tp - 1) * parameters["replicated"] * MODEL.dtype_bytes


def test_the_figures_the_prose_quotes() -> None:
    per_node = SIZING["tokens_per_node"]
    assert round(100 * (per_node(MODEL, 8) / per_node(MODEL, 4) - 1)) == 44
    assert per_node(MODEL, 16) < per_node(MODEL, 8)
    # A 4k-token context holds 1.25 GiB of KV; a TP-4 prefill rank holds some sixty 8k prompts.
    assert 4096 * SIZING["kv_bytes_per_token_per_rank"](MODEL, 1) == 1.25 * (1 << 30)
    prompts = SIZING["kv_budget_per_rank"](MODEL, 4) // (
        8192 * SIZING["kv_bytes_per_token_per_rank"](MODEL, 4))
    assert 55 <= prompts <= 65
    assert SIZING["kv_budget_per_rank"](MODEL, 1) < 0 < SIZING["kv_budget_per_rank"](MODEL, 2)
