"""Compiled grammars, one per structured-output spec, in a bounded LRU cache.

Compiling (building the lexer and parser tables against this model's vocabulary) is the expensive
part of a constrained request; a fresh matcher for each sequence is a deep copy of the cached,
untouched one.
"""
from __future__ import annotations

from collections import OrderedDict

import llguidance.hf
from llguidance import LLMatcher, LLTokenizer
from transformers import PreTrainedTokenizerBase

from baton.services.common.sampling_params import StructuredOutput
from baton.services.common.structured_spec import grammar_of


def make_tokenizer(tokenizer: PreTrainedTokenizerBase, vocab_size: int,
                   eos_ids: frozenset[int]) -> LLTokenizer:
    """The grammar engine's view of the vocabulary, sized like the logits (the model's vocab may
    exceed the tokenizer's: those ids are never allowed) and with every EOS id, so a finished
    grammar can end the output."""
    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=sorted(eos_ids))


class GrammarCache:
    def __init__(self, tokenizer: LLTokenizer, capacity: int = 64) -> None:
        self.tokenizer = tokenizer
        self.capacity = capacity
        self.compiled: OrderedDict[StructuredOutput, LLMatcher] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def matcher(self, spec: StructuredOutput) -> LLMatcher:
        """A fresh matcher at the start of spec's grammar. Raises ValueError when the spec does not
        compile."""
        base = self.compiled.get(spec)
        if base is not None:
            self.hits += 1
            self.compiled.move_to_end(spec)
            return base.deep_copy()
        self.misses += 1
        base = LLMatcher(self.tokenizer, grammar_of(spec.kind, spec.value), log_level=0)
        if base.is_error():
            raise ValueError(f"structured_output invalid {spec.kind}: {base.get_error().strip()}")
        self.compiled[spec] = base
        if len(self.compiled) > self.capacity:
            self.compiled.popitem(last=False)
        return base.deep_copy()
