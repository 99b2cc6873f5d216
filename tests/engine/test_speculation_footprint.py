"""A draft's (or EAGLE head's) share of memory in the target's KV sizing: a cache sized from memory
leaves room for the draft's weights and for its cache of as many blocks; an explicit size that
leaves none is refused up front. The host's memory is fixed here, so the sizes are exact."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from baton.services.checkpoints.tiny_model import count_parameters
from baton.services.common.model_config import load_config
from baton.services.engine.config import EngineConfig
from baton.services.engine.kv import kv_cache
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.speculation.footprint import draft_footprint
from tests.engine.eagle_helpers import make_head

HOST = 64 << 20  # bytes of host memory available, as the tests pretend
BLOCK = 4


@pytest.fixture
def host(monkeypatch):
    monkeypatch.setattr(kv_cache, "psutil", SimpleNamespace(
        virtual_memory=lambda: SimpleNamespace(available=HOST)))
    # The default CPU cache: a quarter of that.
    return int(HOST * kv_cache.CPU_DEFAULT_SHARE)


def draft_spec(model) -> str:
    return json.dumps({"method": "draft_model", "model": str(model), "num_speculative_tokens": 2})


def test_footprints_are_read_from_the_checkpoints(tiny_model_dirs, tmp_path):
    target = tiny_model_dirs["llama"]
    config = load_config(target)
    draft = draft_footprint(draft_spec(target), config, BLOCK, torch.bfloat16)
    assert draft.weight_bytes == 2 * count_parameters(target)
    assert draft.block_bytes == kv_cache.block_bytes(config, BLOCK, torch.bfloat16)
    head = make_head(target, tmp_path / "head", True)
    spec = json.dumps({"method": "eagle3", "model": str(head), "num_speculative_tokens": 2})
    got = draft_footprint(spec, config, BLOCK, torch.float32)
    # Every weight but the integer d2t and boolean t2d maps; one layer's cache.
    assert got.weight_bytes == 4 * (count_parameters(head) - 256 - 512)
    assert got.block_bytes == kv_cache.block_bytes(config, BLOCK, torch.float32) // 2
    ngram = '{"method": "ngram", "num_speculative_tokens": 2}'
    assert draft_footprint(ngram, config, BLOCK, torch.float32) is None


def test_a_cache_sized_from_memory_leaves_room_for_the_draft(tiny_model_dirs, host):
    target = tiny_model_dirs["llama"]
    config = load_config(target)
    per_block = kv_cache.block_bytes(config, BLOCK, torch.float32)
    alone = LLMEngine(EngineConfig(model=str(target), block_size=BLOCK))
    assert alone.blocks.num_blocks == host // per_block
    paired = LLMEngine(EngineConfig(model=str(target), block_size=BLOCK,
                                    speculative_config=draft_spec(target)))
    weights = 4 * count_parameters(target)
    # The target's blocks and the draft's, as many, in what the draft's weights leave.
    assert paired.blocks.num_blocks == (host - weights) // (2 * per_block)
    assert paired.speculator.proposer.runner.num_blocks == paired.blocks.num_blocks


def test_an_explicit_size_that_leaves_the_draft_no_room_is_refused(tiny_model_dirs, host):
    target = tiny_model_dirs["llama"]
    config = load_config(target)
    per_block = kv_cache.block_bytes(config, BLOCK, torch.float32)
    room = int(HOST * kv_cache.CPU_EXPLICIT_SHARE)
    # Fits alone, not with a draft of the same size beside it.
    blocks = room // per_block - 1
    assert LLMEngine(EngineConfig(model=str(target), block_size=BLOCK,
                                  num_kv_blocks=blocks)).blocks.num_blocks == blocks
    with pytest.raises(kv_cache.KVCacheTooLarge, match="less .* of draft weights"):
        LLMEngine(EngineConfig(model=str(target), block_size=BLOCK, num_kv_blocks=blocks,
                               speculative_config=draft_spec(target)))
