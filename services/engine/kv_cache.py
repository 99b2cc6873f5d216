"""Sizing and allocation of the paged KV cache.

Layout [layers, blocks, 2, block_size, kv_heads, head_dim]: each (layer, block) pair, K and V together, is one
contiguous range of memory, which is what a KV hand-off registers and moves.
"""
from __future__ import annotations

import logging

import torch
from transformers import PretrainedConfig

from baton.services.engine.config import EngineConfig
from baton.services.engine.models.loader import head_dim

log = logging.getLogger(__name__)

GIB = 1 << 30
DEFAULT_CPU_KV_GIB = 2.0


def block_bytes(config: PretrainedConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block across all layers."""
    per_token = 2 * config.num_key_value_heads * head_dim(config) * (torch.finfo(dtype).bits // 8)
    return config.num_hidden_layers * block_size * per_token


def _activation_reserve(engine: EngineConfig, config: PretrainedConfig, dtype: torch.dtype) -> int:
    """A generous bound on one step's transient memory: MLP activations of the token budget plus logits."""
    itemsize = torch.finfo(dtype).bits // 8
    mlp = engine.max_num_batched_tokens * (3 * config.intermediate_size + 6 * config.hidden_size) * itemsize
    logits = engine.max_num_seqs * config.vocab_size * 4 * 4
    return mlp + logits


def num_blocks(engine: EngineConfig, config: PretrainedConfig, dtype: torch.dtype, device: torch.device) -> int:
    if engine.num_kv_blocks is not None:
        return engine.num_kv_blocks
    if engine.kv_cache_memory_gib is not None:
        budget = int(engine.kv_cache_memory_gib * GIB)
    elif device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        budget = int(total * engine.gpu_memory_utilization) - torch.cuda.memory_allocated(device)
        budget -= _activation_reserve(engine, config, dtype)
    else:
        budget = int(DEFAULT_CPU_KV_GIB * GIB)
    blocks = budget // block_bytes(config, engine.block_size, dtype)
    if blocks < 1:
        raise ValueError(f"KV-cache budget of {budget} bytes holds no block; raise it or lower max_num_batched_tokens")
    log.info("KV cache: %d blocks of %d tokens (%.2f GiB)", blocks, engine.block_size,
             blocks * block_bytes(config, engine.block_size, dtype) / GIB)
    return blocks


def allocate(config: PretrainedConfig, blocks: int, block_size: int, dtype: torch.dtype,
             device: torch.device) -> torch.Tensor:
    shape = (config.num_hidden_layers, blocks, 2, block_size, config.num_key_value_heads, head_dim(config))
    return torch.zeros(shape, dtype=dtype, device=device)
