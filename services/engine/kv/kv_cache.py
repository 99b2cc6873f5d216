"""Sizing and allocation of the paged KV cache.

Layout [layers, blocks, 2, block_size, kv_heads, head_dim] (layout.py), token- or head-major within
a block: either way each (layer, block) pair, K and V together, is one contiguous range of memory,
which is what a KV hand-off registers and moves.

Without an explicit size the cache takes what memory allows: on a GPU, gpu_memory_utilization of the
card less everything already in use (weights, other processes) and a bound on one step's
activations; on a CPU, a share of the host's available memory, at most DEFAULT_CPU_KV_GIB. An
explicit size that cannot fit is refused up front, naming the sizes, instead of failing later with
an out-of-memory traceback.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import psutil
import torch
from transformers import PretrainedConfig

from baton.services.common.model_config import head_dim
from baton.services.engine.config import EngineConfig
from baton.services.engine.kv.layout import Order

log = logging.getLogger(__name__)

GIB = 1 << 30
DEFAULT_CPU_KV_GIB = 2.0
# Of the host's available memory: what the default CPU cache may take, and what an explicit size
# may.
CPU_DEFAULT_SHARE, CPU_EXPLICIT_SHARE = 0.25, 0.9


class KVCacheTooLarge(ValueError):
    """An explicit KV-cache size exceeds the memory left for it."""


@dataclass(frozen=True)
class MemoryBudget:
    available: int  # bytes the cache may take
    default: int  # bytes it takes when no size is given
    where: str  # how available was worked out, for messages


def block_bytes(config: PretrainedConfig, block_size: int, dtype: torch.dtype,
                kv_heads: int | None = None) -> int:
    """Bytes of one block across all layers; kv_heads: those this cache holds (a tensor-parallel
    rank's), default all of the model's."""
    kv_heads = config.num_key_value_heads if kv_heads is None else kv_heads
    per_token = 2 * kv_heads * head_dim(config) * (torch.finfo(dtype).bits // 8)
    return config.num_hidden_layers * block_size * per_token


def _activation_reserve(engine: EngineConfig, config: PretrainedConfig, dtype: torch.dtype) -> int:
    """A generous bound on one step's transient memory: MLP activations of the token budget plus
    logits, and the CUDA graphs' own pool, which holds a decode batch's activations beside the eager
    allocator's."""
    itemsize = torch.finfo(dtype).bits // 8
    per_token = (3 * config.intermediate_size + 6 * config.hidden_size) * itemsize
    logits = engine.max_num_seqs * config.vocab_size * 4 * 4
    graphs = 0 if engine.enforce_eager else min(engine.cuda_graph_max_batch_size,
                                                engine.max_num_seqs) * per_token
    return engine.max_num_batched_tokens * per_token + logits + graphs


def memory_budget(engine: EngineConfig, config: PretrainedConfig, dtype: torch.dtype,
                  device: torch.device) -> MemoryBudget:
    """What the KV cache may take on device, once the weights are loaded."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        reserve = _activation_reserve(engine, config, dtype)
        available = max(0, int(total * engine.gpu_memory_utilization) - (total - free) - reserve)
        where = (
            f"{engine.gpu_memory_utilization:g} of {_gib(total)} on "
            f"{torch.cuda.get_device_name(device)}, "
            f"less {_gib(total - free)} in use and {_gib(reserve)} reserved for activations")
        return MemoryBudget(available, available, where)
    host = psutil.virtual_memory().available
    default = min(int(DEFAULT_CPU_KV_GIB * GIB), int(host * CPU_DEFAULT_SHARE))
    return MemoryBudget(int(host * CPU_EXPLICIT_SHARE), default,
                        f"{CPU_EXPLICIT_SHARE:g} of the host's {_gib(host)} available")


@dataclass(frozen=True)
class Companion:
    """What a speculative draft (or EAGLE head) loaded after the target takes beside it: its
    weights, and a cache of as many blocks as the target's, of block_bytes each."""
    weight_bytes: int
    block_bytes: int


def num_blocks(engine: EngineConfig, config: PretrainedConfig, dtype: torch.dtype,
               device: torch.device, max_model_len: int | None = None,
               wanted: int | None = None, kv_heads: int | None = None,
               companion: Companion | None = None) -> int:
    """Blocks to allocate; raises KVCacheTooLarge when an explicit size cannot fit.

    wanted: without an explicit size, this many blocks (a benchmark sized to its work), capped at
    what memory allows, with a warning when capped. kv_heads: as for block_bytes. companion: a
    draft's share, taken off the budget (its weights) and counted with every block (its cache)."""
    per_block = block_bytes(config, engine.block_size, dtype, kv_heads)
    budget = memory_budget(engine, config, dtype, device)
    if companion is not None:
        budget = _beside(budget, companion)
        per_block += companion.block_bytes
    if engine.num_kv_blocks is not None:
        blocks, asked = engine.num_kv_blocks, f"num_kv_blocks={engine.num_kv_blocks}"
    elif engine.kv_cache_memory_gib is not None:
        asked = f"kv_cache_memory_gib={engine.kv_cache_memory_gib:g}"
        blocks = int(engine.kv_cache_memory_gib * GIB) // per_block
    elif wanted is not None:
        blocks, asked = min(wanted, budget.available // per_block), ""
        if blocks < wanted:
            log.warning("KV cache capped at %d blocks (%s) of the %d wanted (%s): %s", blocks,
                        _gib(blocks * per_block), wanted, _gib(wanted * per_block), budget.where)
    else:
        blocks, asked = budget.default // per_block, ""
    if asked and blocks * per_block > budget.available:
        raise KVCacheTooLarge(
            f"{asked} needs {_gib(blocks * per_block)} of KV cache ({blocks} blocks of {per_block} "
            "bytes), but only "
            f"{_gib(budget.available)} can be given to it ({budget.where}); lower it, or leave it "
            "unset to size the "
            f"cache from memory")
    if blocks < 1:
        raise ValueError(
            f"the KV-cache budget of {_gib(budget.default)} ({budget.where}) holds no block of "
            f"{per_block} bytes; free memory or lower max_num_batched_tokens")
    log.info("KV cache: %d blocks of %d tokens (%s)%s", blocks, engine.block_size,
             _gib(blocks * per_block), "" if asked else f", sized from memory: {budget.where}")
    if (not asked and wanted is None and max_model_len is not None and
            blocks * engine.block_size < max_model_len):
        log.warning("the KV cache holds %d tokens, less than one full-length sequence (%d)",
                    blocks * engine.block_size, max_model_len)
    return blocks


def max_blocks(engine: EngineConfig, config: PretrainedConfig, dtype: torch.dtype,
               device: torch.device) -> int:
    """The most blocks this device can hold (what num_blocks would size the cache to, explicit sizes
    aside)."""
    return memory_budget(engine, config, dtype, device).available // block_bytes(
        config, engine.block_size, dtype)


def _beside(budget: MemoryBudget, companion: Companion) -> MemoryBudget:
    """The budget less the companion's weights; block sizes then count its cache too."""
    weights = companion.weight_bytes
    return MemoryBudget(max(0, budget.available - weights), max(0, budget.default - weights),
                        f"{budget.where}, less {_gib(weights)} of draft weights, and each block "
                        f"with the draft's {companion.block_bytes} bytes")


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def allocate(config: PretrainedConfig, blocks: int, block_size: int, dtype: torch.dtype,
             device: torch.device, kv_heads: int | None = None,
             order: Order = "NHD") -> torch.Tensor:
    """The cache, of logical shape [layers, blocks, 2, block_size, kv_heads, head_dim] in either
    order (layout.py): HND's is a strided view of head-major storage."""
    kv_heads = config.num_key_value_heads if kv_heads is None else kv_heads
    layers, dim = config.num_hidden_layers, head_dim(config)
    if order == "HND":
        shape = (layers, blocks, 2, kv_heads, block_size, dim)
        return torch.zeros(shape, dtype=dtype, device=device).transpose(3, 4)
    return torch.zeros((layers, blocks, 2, block_size, kv_heads, dim), dtype=dtype, device=device)
