"""How a model splits over tensor-parallel ranks (Megatron-style, as vLLM does).

Query heads split evenly; KV heads split evenly when there are at least as many as ranks, and are
replicated otherwise, each rank keeping the one KV head its query heads attend with (so the number
of ranks must then be a multiple of the KV heads). MLP columns split evenly; the vocabulary splits
into equal ranges, the last one padded. Everything is checked against the config before any
process starts, so a model that does not split fails with one line naming the sizes.
"""
from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

from baton.services.common.model_config import head_dim


class ShardingError(ValueError):
    """A model that cannot be split over the requested number of ranks."""


def check_splits(config: PretrainedConfig, size: int) -> None:
    """Raises ShardingError when `size` ranks cannot split this model."""
    if size == 1:
        return
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    problems = []
    if heads % size:
        problems.append(f"{heads} attention heads")
    if kv_heads >= size and kv_heads % size:
        problems.append(f"{kv_heads} KV heads")
    if kv_heads < size and size % kv_heads:
        problems.append(f"{kv_heads} KV heads (fewer than the ranks, so the ranks must be a "
                        "multiple of them to replicate each)")
    if config.intermediate_size % size:
        problems.append(f"an intermediate size of {config.intermediate_size}")
    if problems:
        raise ShardingError(f"--tensor-parallel-size {size} does not divide the model's "
                            f"{' and '.join(problems)}")


def even_range(total: int, rank: int, size: int) -> slice:
    """Rank's share of `total` rows that split evenly."""
    if total % size:
        raise ShardingError(f"{total} rows do not split over {size} ranks")
    part = total // size
    return slice(rank * part, (rank + 1) * part)


@dataclass(frozen=True)
class HeadSplit:
    """A rank's attention heads: query heads [q_start, q_start + num_heads) and KV heads
    [kv_start, kv_start + num_kv_heads)."""
    num_heads: int
    num_kv_heads: int
    q_start: int
    kv_start: int

    @classmethod
    def of(cls, total_heads: int, total_kv_heads: int, rank: int, size: int) -> "HeadSplit":
        heads = total_heads // size
        if total_kv_heads >= size:
            kv_heads, kv_start = total_kv_heads // size, rank * (total_kv_heads // size)
        else:
            # Replicated: size // total_kv_heads consecutive ranks share each KV head, which is
            # the one their query heads' group uses.
            kv_heads, kv_start = 1, rank // (size // total_kv_heads)
        return cls(heads, kv_heads, rank * heads, kv_start)


def local_kv_heads(config: PretrainedConfig, size: int) -> int:
    """KV heads each rank's cache holds."""
    kv = config.num_key_value_heads
    return kv // size if kv >= size else 1


def vocab_range(vocab_size: int, rank: int, size: int) -> tuple[int, int, int]:
    """(first token id, end, rows per rank): equal ranges of ceil(vocab / size) rows, the last
    rank's padded past the vocabulary."""
    per_rank = -(-vocab_size // size)
    start = min(vocab_size, rank * per_rank)
    return start, min(vocab_size, start + per_rank), per_rank


def kv_cache_heads(config: PretrainedConfig, size: int) -> tuple[int, int]:
    """(KV heads, head_dim) of each rank's cache."""
    return local_kv_heads(config, size), head_dim(config)
