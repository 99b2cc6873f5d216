"""Attention and KV-cache kernels for the paged cache.

Each kernel lives in its own module (kv_cache_write, paged_decode_attention,
paged_prefill_attention) that imports Triton itself; `reference` holds plain torch
versions of the same functions. Nothing here imports Triton at package import, because
Triton reads TRITON_INTERPRET once, when it is first imported.
"""
