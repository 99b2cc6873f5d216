"""The engine's one typed configuration (flags: `--block-size`, env: `BATON_BLOCK_SIZE`, ...)."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from baton.services.common.settings import BatonSettings
from baton.services.common.model_config import load_config
from baton.services.engine.speculation.config import check_draft_vocab, parse_speculative_config


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
    kv_cache_layout: Literal["NHD", "HND"] = Field(
        "NHD",
        description="Order within a KV block: NHD token-major, HND head-major (each KV head's "
                    "tokens contiguous, so a hand-off between pools of different "
                    "tensor-parallel sizes moves one piece per layer, block and head run instead "
                    "of one per token; use HND on both pools)")
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
    kv_offload_host_gib: float = Field(
        0.0, ge=0,
        description="Host-memory KV tier in GiB below the device cache (0 = off): freed prefix "
                    "blocks are kept there and loaded back instead of recomputed; under tensor "
                    "parallelism each rank holds this much, of its own heads")
    kv_offload_disk_dir: str | None = Field(
        None, description="Local-disk KV tier below the host tier: the folder of its block files "
                          "(needs --kv-offload-host-gib); under tensor parallelism each rank "
                          "keeps its own heads' share under <dir>/tp-<size>/rank-<rank> on its "
                          "own node")
    kv_offload_disk_gib: float = Field(
        16.0, gt=0, description="Local-disk KV tier: most GiB of block files it keeps (under "
                                "tensor parallelism, each rank)")
    preemption_mode: Literal["auto", "swap", "recompute"] = Field(
        "auto",
        description="What a preempted request's KV becomes: swap keeps its full blocks in the "
                    "host tier and loads them back on resume; recompute drops them; auto is swap "
                    "with a host tier, else recompute")
    enable_lora: bool = Field(
        False, description="Serve LoRA adapters (implied by --lora-modules); requests name one in "
                           "`model`")
    lora_modules: list[str] = Field(
        [], description="LoRA adapters to serve: name=path, or JSON {\"name\", \"path\", "
                        "\"base_model_name\"} (PEFT folders)")
    max_loras: int = Field(1, ge=1, description="LoRA adapters resident on the device at once "
                                                "(a step's batch mixes at most this many)")
    max_cpu_loras: int | None = Field(
        None, ge=1, description="LoRA adapters kept loaded in host memory, least recently used "
                                "dropped first (default: max_loras)")
    max_lora_rank: int = Field(16, ge=1, le=512, description="Highest LoRA rank accepted")
    speculative_config: str | None = Field(
        None,
        description="Speculative decoding, as vLLM's JSON: method ngram with "
                    "num_speculative_tokens (1-16) and prompt_lookup_min/max, method "
                    "draft_model with model (a checkpoint sharing the target's vocabulary), or "
                    "method eagle / eagle3 with model (an EAGLE head's folder in its published "
                    "format), each with num_speculative_tokens; all with disable_by_batch_size "
                    "(a step with more sequences does not speculate); other methods and keys "
                    "are refused")
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, json_schema_extra={"flag_aliases": ["-tp"]},
        description="Ranks the model is sharded over (Megatron-style), one process per rank; on "
                    "GPU one GPU each")
    distributed_executor_backend: Literal["mp", "ray"] = Field(
        "mp",
        description="How ranks other than 0 start: mp, processes on this node; ray, actors in a "
                    "placement group of the Ray cluster this process joins (multi-node)")
    distributed_timeout_seconds: float = Field(
        300.0, gt=0,
        description="Longest a tensor-parallel collective may wait before the worker gives up: "
                    "the backstop for a hung rank (a rank that dies is noticed at once); generous, "
                    "since a starved CPU or a first CUDA step may stall a rank for long")
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

    @model_validator(mode="after")
    def _tiers_fit(self) -> "EngineConfig":
        if self.kv_offload_disk_dir is not None and self.kv_offload_host_gib == 0:
            raise ValueError("kv_offload_disk_dir needs a host tier: set kv_offload_host_gib too "
                             "(blocks reach the disk tier on leaving the host tier)")
        if self.kv_offload_host_gib > 0 and not self.enable_prefix_caching:
            raise ValueError("KV tiers keep prefix-cache blocks: kv_offload_host_gib needs "
                             "enable_prefix_caching")
        if self.preemption_mode == "swap" and self.kv_offload_host_gib == 0:
            raise ValueError("preemption_mode swap needs a host tier: set kv_offload_host_gib")
        return self

    @model_validator(mode="after")
    def _lora_modules_enable_lora(self) -> EngineConfig:
        # vLLM's rule: naming adapters turns LoRA on; the host cache holds at least the slots.
        if self.lora_modules:
            self.enable_lora = True
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras "
                             f"({self.max_loras})")
        return self

    @model_validator(mode="after")
    def _draft_shares_the_vocabulary(self) -> EngineConfig:
        spec = parse_speculative_config(self.speculative_config)
        # A target that is not a readable checkpoint is reported where the model loads.
        if spec is not None and self.model is not None and (
                Path(self.model) / "config.json").is_file():
            check_draft_vocab(spec, load_config(self.model))
        return self

    @field_validator("speculative_config")
    @classmethod
    def _check_speculative_config(cls, value: str | None) -> str | None:
        parse_speculative_config(value)  # raises, naming the key, before anything loads
        return value
