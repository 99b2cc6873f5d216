"""Prefix-cache block keys, shared by every worker and the router so that all compute identical
hashes.

A block's key chains its parent's key with its token ids. The first block's parent is a root derived
from a fixed seed, the model identity, an optional per-tenant salt and the LoRA adapter the request
runs under, so neither different models, tenants nor adapters ever share (or can probe) each
other's cached blocks (a prefix computed under one adapter holds other KV than under another).
Keys are 64-bit so they fit protobuf uint64.
"""
from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

HASH_SEED = b"baton-prefix-cache-v1"


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def root_hash(model_id: str, cache_salt: str | None = None, lora_name: str | None = None) -> int:
    salt = b"" if cache_salt is None else cache_salt.encode()
    # The base model's root is unchanged from before adapters existed.
    adapter = b"" if lora_name is None else b"\0lora\0" + lora_name.encode()
    return _digest(HASH_SEED + b"\0" + model_id.encode() + b"\0" + salt + adapter)


def block_hashes(token_ids: Sequence[int], block_size: int, model_id: str,
                 cache_salt: str | None = None, start: int = 0,
                 parent: int | None = None, lora_name: str | None = None) -> list[int]:
    """Keys of the full blocks of token_ids, from block index `start` (whose parent key is
    `parent`)."""
    h = root_hash(model_id, cache_salt, lora_name) if parent is None else parent
    # Each key digests the parent key's 8 bytes and the block's token ids as int64; the token array
    # is packed once rather than once per block (the router hashes every prompt on its decision
    # path).
    data = array("q", token_ids[start * block_size:(len(token_ids) // block_size) *
                                block_size]).tobytes()
    stride = block_size * 8
    keys = []
    for offset in range(0, len(data), stride):
        h = _digest(h.to_bytes(8, "little") + data[offset:offset + stride])
        keys.append(h)
    return keys
