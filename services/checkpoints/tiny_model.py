"""Tiny random Hugging Face checkpoints: test fixtures, the benchmark model, and the product's
embedded default.

The weights are random, so outputs are gibberish, but every file is a real checkpoint that
transformers loads: a byte-level BPE tokenizer trained on a small embedded corpus, a ChatML chat
template, config.json, generation_config.json and model.safetensors.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from safetensors import safe_open
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (AutoModelForCausalLM, GenerationConfig, LlamaConfig, PretrainedConfig,
                          PreTrainedTokenizerFast, Qwen2Config, Qwen3Config)

log = logging.getLogger(__name__)

Arch = Literal["llama", "qwen2", "qwen3"]
ARCHS: tuple[str, ...] = get_args(Arch)

EOS_TOKEN = "<|endoftext|>"
# One tokenizer for every arch and no BOS token: a Qwen-style layout keeps ids identical across
# archs.
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")
# every byte must be a token so any UTF-8 text round-trips
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256

# ChatML with Hermes/Qwen2.5-style tools: the function signatures go in the system turn inside
# <tools></tools>, an assistant's calls are <tool_call>{"name": ..., "arguments":
# {...}}</tool_call>, and tool results are <tool_response> blocks in a user turn. Content may also
# be a list of OpenAI-style parts, of which only text parts are rendered.
CHAT_TEMPLATE = (
    "{%- macro render(content) %}"
    "{%- if content is string %}{{- content }}"
    "{%- elif content %}{%- for part in content if part['type'] == 'text' %}{{- part['text'] }}{%- "
    "endfor %}"
    "{%- endif %}"
    "{%- endmacro %}"
    "{%- set skip_first = false %}"
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- render(messages[0]['content']) + '\\n\\n' }}"
    "{%- set skip_first = true %}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions. Their signatures are within "
    "<tools></tools>:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each call, return a JSON object with the function name and "
    "arguments within '"
    "'<tool_call></tool_call> tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}'"
    "'\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if loop.first and skip_first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' "
    "}}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + render(message['content']) + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- "
    "endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + render(message['content']) }}"
    "{%- for call in message['tool_calls'] or [] %}"
    "{%- set call = call['function'] if call['function'] is defined else call %}"
    "{%- if not loop.first or message['content'] %}{{- '\\n' }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": ' + (call['name'] | tojson) + ', \"arguments\": ' }}"
    "{{- (call['arguments'] if call['arguments'] is string else call['arguments'] | tojson) + "
    "'}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


@dataclass(frozen=True)
class TinyModelSpec:
    arch: Arch = "llama"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    vocab_size: int = 512
    max_position_embeddings: int = 2048
    # HF's 0.02 gives flat logits (std ~0.16 at hidden 64): 2% of greedy steps have a top-2 gap
    # under 1e-3, which kernel rounding can flip, and greedy output often repeats one token. 0.3
    # gives logit std ~2.4: median gap ~0.55, under 0.3% of steps within 1e-3, and varied output.
    # The bench preset's 0.1 is the same logit scale at hidden 512.
    initializer_range: float = 0.3
    tie_word_embeddings: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch must be one of {ARCHS}, not {self.arch!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise ValueError(f"vocab_size must be at least {MIN_VOCAB_SIZE}")

    @classmethod
    def preset(cls, arch: Arch = "llama", name: str = "tiny", **overrides: Any) -> TinyModelSpec:
        """`tiny`: ~150K parameters, for tests; `bench`: a ~30M-parameter Llama-shaped model for
        benchmarks."""
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {tuple(PRESETS)}, not {name!r}")
        return cls(arch=arch, **{**PRESETS[name], **ARCH_DEFAULTS[name].get(arch, {}), **overrides})


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {},
    "bench": dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64,
                  intermediate_size=1536, vocab_size=4096, initializer_range=0.1),
}
# Each arch covers a shape the others do not: Qwen2 ties embeddings (and has q/k/v biases), Qwen3
# has q/k norms and a head count that is not a power of two, with num_heads * head_dim !=
# hidden_size.
ARCH_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {"qwen2": dict(tie_word_embeddings=True), "qwen3": dict(num_heads=6)},
    "bench": {"qwen2": dict(tie_word_embeddings=True)},
}
CONFIG_CLASSES: dict[str, type[PretrainedConfig]] = {
    "llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config
}


def train_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of exactly vocab_size tokens with the tiny models' chat
    template (deterministic: the same size always gives the same tokenizer)."""
    assets = resources.files("baton.services.checkpoints").joinpath("assets")
    corpus = assets.joinpath("tiny_corpus.txt").read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([corpus], trainer)
    # The corpus runs out of merges at ~1600 tokens; reserved tokens (as in Llama 3) fill the
    # embedding rows above that, so every id the model can emit is known to the tokenizer.
    filler = range(vocab_size - tok.get_vocab_size())
    tok.add_special_tokens([AddedToken(f"<|reserved_{i}|>", special=True) for i in filler])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN,
                                   chat_template=CHAT_TEMPLATE)


def _config(spec: TinyModelSpec, eos_id: int) -> PretrainedConfig:
    return CONFIG_CLASSES[spec.arch](
        vocab_size=spec.vocab_size, hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim, max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range, tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=eos_id, dtype="float32")


def make_tiny_model(out_dir: str | Path, spec: TinyModelSpec) -> Path:
    """Write a random checkpoint to `out_dir`; the same spec always gives byte-identical files."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec.vocab_size)
    tokenizer.model_max_length = spec.max_position_embeddings
    eos_id = tokenizer.eos_token_id
    config = _config(spec, eos_id)
    # fork_rng so seeding here does not disturb the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id,
                                               pad_token_id=eos_id)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def count_parameters(model_dir: str | Path) -> int:
    """Parameters stored in a single-file checkpoint (tied embeddings count once)."""
    total = 0
    with safe_open(Path(model_dir) / "model.safetensors", framework="pt") as f:
        for name in f.keys():
            total += torch.Size(f.get_slice(name).get_shape()).numel()
    return total


def embedded_model_path() -> Path:
    """The default model when none is configured: a tiny Llama, made once under $BATON_CACHE_DIR."""
    root = Path(os.environ.get("BATON_CACHE_DIR") or "~/.cache/baton").expanduser() / "models"
    final = root / "tiny-llama"
    if final.is_dir():
        _refresh_chat_template(final)
        return final
    root.mkdir(parents=True, exist_ok=True)
    # Build aside and rename: the rename is atomic, so readers never see a half-written folder and,
    # when processes race, the first rename wins and the others fail harmlessly onto the finished
    # folder.
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-llama-", dir=root))
    try:
        log.info("creating the embedded tiny model in %s", final)
        make_tiny_model(tmp, TinyModelSpec.preset("llama"))
        os.rename(tmp, final)
    except OSError:
        if not final.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _refresh_chat_template(model_dir: Path) -> None:
    """An embedded model made by an older Baton gets the current chat template (tool support came
    later)."""
    path = model_dir / "chat_template.jinja"
    if not path.is_file() or path.read_text(encoding="utf-8") == CHAT_TEMPLATE:
        return
    tmp = path.with_name(f".chat_template.{os.getpid()}.tmp")
    tmp.write_text(CHAT_TEMPLATE, encoding="utf-8")
    # atomic: a concurrent reader sees the old or the new template, never half of one
    os.replace(tmp, path)
