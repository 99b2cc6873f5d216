"""Request intake: the checks a request passes before the engine takes it, the Sequence it becomes
(with its detokenizer and, for a structured output, its grammar matcher), and the table of the
requests in flight by id."""
from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig, PreTrainedTokenizerBase

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.detokenizer import IncrementalDetokenizer
from baton.services.engine.kv.block_manager import BlockManager
from baton.services.engine.kv.handoff import HandoffTable
from baton.services.engine.lora.manager import LoRAManager
from baton.services.engine.lora.modules import LoRANotFound
from baton.services.engine.sampler import skip_draws
from baton.services.engine.sequence import Sequence
from baton.services.engine.structured.compiler import GrammarCache, make_tokenizer
from baton.services.engine.structured.masks import MaskBuilder
from baton.services.engine.structured.matcher import GrammarState


@dataclass(frozen=True)
class EngineRequest:
    """A request as the engine takes it, whichever way it enters (queued, or reserved)."""
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    cache_salt: str | None = None
    lora_name: str | None = None  # the adapter named by the request's `model`; None: the base


class RequestIntake:
    """Validates requests and keeps those in flight: each id maps to its Sequence and detokenizer
    from admission until it finishes, is aborted, or leaves the batch for a hand-off."""

    def __init__(self, config: EngineConfig, model_config: PretrainedConfig,
                 tokenizer: PreTrainedTokenizerBase, eos_ids: frozenset[int], max_model_len: int,
                 blocks: BlockManager, handoffs: HandoffTable,
                 lora: LoRAManager | None = None) -> None:
        self.config = config
        self.vocab_size = model_config.vocab_size
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_model_len = max_model_len
        self.blocks = blocks
        self.handoffs = handoffs
        self.lora = lora
        self.seqs: dict[str, Sequence] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        # Built on the first structured request: wrapping a large vocabulary for the grammar engine
        # takes ~1 s.
        self.grammars: GrammarCache | None = None
        self.masks: MaskBuilder | None = None

    def admit(self, request: EngineRequest, output_token_ids: list[int] | None = None,
              prefilled: bool = False) -> Sequence:
        """A new Sequence for request, now in flight. Raises ValueError with a client-facing
        message when the request can never be served.

        output_token_ids: tokens already generated (and streamed) elsewhere; generation continues
        after them. prefilled: the decode side of a hand-off. Either way another worker admitted
        the request first, so an adapter unloaded since still serves it."""
        request_id, prompt, params = request.request_id, request.prompt_token_ids, request.params
        if request_id in self.seqs or self.handoffs.held(request_id) is not None:
            raise ValueError(f"request id {request_id!r} is already in flight")
        params.validate(self.config.max_logprobs)
        self._check_engine_params(params)
        self._check_lora(request.lora_name, prefilled or bool(output_token_ids))
        outputs = list(output_token_ids or ())
        if len(outputs) >= params.max_tokens:
            raise ValueError(f"the request already has {len(outputs)} output tokens of max_tokens "
                             f"{params.max_tokens}")
        self._check_prompt(prompt + outputs, params, len(outputs))
        seq = Sequence(request_id, prompt, params, priority=request.priority,
                       cache_salt=request.cache_salt, output_token_ids=outputs,
                       lora_name=request.lora_name)
        if params.structured_output is not None:
            seq.grammar = self._grammar(params, outputs)
        skip_draws(seq, self.vocab_size, len(outputs))
        detok = IncrementalDetokenizer(self.tokenizer.backend_tokenizer, seq.prompt_token_ids,
                                       params)
        # Replaying the tokens generated elsewhere leaves the detokenizer where the first worker's
        # was: text a possible stop string held back is still to be released, and a stop string may
        # complete across the seam.
        for token in outputs:
            detok.add(token)
        detok.release(final=False)
        self.seqs[request_id], self.detokenizers[request_id] = seq, detok
        return seq

    def forget(self, request_id: str) -> None:
        """The request is no longer in flight here."""
        del self.seqs[request_id], self.detokenizers[request_id]

    def _grammar(self, params: SamplingParams, outputs: list[int]) -> GrammarState:
        """A matcher for the request's structured output, past the tokens it already generated
        elsewhere."""
        if self.grammars is None:
            self.grammars = GrammarCache(make_tokenizer(self.tokenizer, self.vocab_size,
                                                        self.eos_ids),
                                         self.config.grammar_cache_size)
            self.masks = MaskBuilder(self.vocab_size)
        state = GrammarState(self.grammars.matcher(params.structured_output))
        state.replay(outputs)
        return state

    def _check_lora(self, name: str | None, admitted_elsewhere: bool) -> None:
        if name is None:
            return
        if self.lora is None:
            raise LoRANotFound(f"the LoRA adapter {name!r} is not served here (LoRA is off)")
        self.lora.check(name, admitted_elsewhere)

    def _check_engine_params(self, params: SamplingParams) -> None:
        vocab = self.vocab_size
        if params.logit_bias and any(t >= vocab for t in params.logit_bias):
            raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
        if params.prompt_logprobs is not None and self.config.engine == "sim":
            raise ValueError(
                "prompt_logprobs needs the model engine; the simulated engine computes no logits")

    def _check_prompt(self, prompt: list[int], params: SamplingParams,
                      num_generated: int = 0) -> None:
        if not prompt:
            raise ValueError("prompt must contain at least one token")
        vocab = self.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        total = len(prompt) + params.max_tokens - num_generated
        if total > self.max_model_len:
            raise ValueError(
                f"this model's maximum context length is {self.max_model_len} tokens; the request "
                f"asks for {total} ({len(prompt)} prompt + {params.max_tokens} to generate)")
        if self.blocks.blocks_needed(total) > self.blocks.num_blocks:
            raise ValueError(f"the request needs {total} tokens of KV cache; this worker holds "
                             f"{self.blocks.num_blocks * self.blocks.block_size}")
        if not self.config.enable_chunked_prefill and total > self.config.max_num_batched_tokens:
            raise ValueError(
                "with chunked prefill off, prompt plus output is limited to "
                "max_num_batched_tokens "
                f"({self.config.max_num_batched_tokens})")
