"""The engine's one typed configuration (flags: `--block-size`, env: `BATON_BLOCK_SIZE`, ...)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from baton.services.common.settings import BatonSettings


class EngineConfig(BatonSettings):
    model: str | None = Field(
        None, description="Hugging Face checkpoint folder; unset serves the embedded tiny model")
    served_model_name: str | None = Field(
        None,
        description="Model name clients use; also part of every prefix-cache hash (default: "
                    "folder name)")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="Weight and KV dtype; auto is the checkpoint's dtype on GPU and float32 on CPU")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where the model runs")
    block_size: int = Field(16, ge=1, le=256, description="Tokens per KV-cache block")
    kv_cache_memory_gib: float | None = Field(
        None, gt=0,
        description="KV-cache budget in GiB (default: on GPU what gpu_memory_utilization leaves "
                    "after weights and activations; on CPU a quarter of available host "
                    "memory, at most 2)")
    num_kv_blocks: int | None = Field(
        None, ge=1, description="Exact number of KV blocks; overrides the memory budget")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1,
                                          description="Share of GPU memory the engine may use")
    max_model_len: int | None = Field(None, ge=1,
                                      description="Context length cap (default: the model's)")
    max_num_batched_tokens: int = Field(2048, ge=1, description="Token budget of one engine step")
    max_num_seqs: int = Field(256, ge=1, description="Most requests in one step's batch")
    enable_prefix_caching: bool = Field(True,
                                        description="Reuse KV blocks of identical prompt prefixes")
    enable_chunked_prefill: bool = Field(
        True, description="Split long prompts across steps so decodes keep flowing")
    attention_backend: Literal["auto", "torch", "triton"] = Field(
        "auto", description="Attention kernels: Triton on GPU, torch on CPU when auto")
    enforce_eager: bool = Field(False, description="Disable CUDA graphs for decode steps")
    cuda_graph_max_batch_size: int = Field(
        256, ge=1,
        description="Largest decode batch captured as a CUDA graph (larger batches run eagerly; "
                    "buckets 1, 2, 4, 8, then multiples of 16)")
    num_threads: int | None = Field(
        None, ge=1, description="CPU threads for torch (default: torch's own choice, one per core)")
    seed: int = Field(0, description="Seed of the sampler for requests without their own seed")
    max_logprobs: int = Field(
        20, ge=-1,
        description="Most top logprobs a request may ask for (-1: no limit, so a request may ask "
                    "for the whole vocabulary with -1)")
    grammar_cache_size: int = Field(
        64, ge=1,
        description="Compiled structured-output grammars kept, least recently used dropped first")
    engine: Literal["model", "sim"] = Field(
        "model",
        description="model: run the checkpoint; sim: a timing model stands in for the forward pass "
                    "(the scheduler, block manager and prefix cache stay real; --model only gives "
                    "the tokenizer)")
    sim_num_kv_blocks: int = Field(4096, ge=1,
                                   description="sim: KV blocks when --num-kv-blocks is unset")
    sim_step_base_seconds: float = Field(0.002, ge=0, description="sim: fixed cost of every step")
    sim_prefill_tokens_per_second: float = Field(20000.0, gt=0,
                                                 description="sim: linear prefill throughput")
    sim_prefill_seconds_per_token_squared: float = Field(
        0.0, ge=0,
        description="sim: attention cost per prefill token per context token (the quadratic term)")
    sim_decode_seconds_per_sequence: float = Field(0.0002, ge=0,
                                                   description="sim: cost of each decode row")
    sim_decode_seconds_per_context_token: float = Field(
        0.0, ge=0, description="sim: cost per context token a decode row reads (KV bandwidth)")
