"""Incremental detokenization with stop strings.

Text is released as soon as it is final: complete UTF-8 characters only (tokenizers' DecodeStream
buffers split multi-byte sequences), and minus the shortest tail that could still grow into a stop
string.
"""
from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from baton.services.common.sampling_params import SamplingParams

# Prompt tokens given to the stream as context, so the first output token decodes as it would
# mid-text (SentencePiece-style decoders strip a leading space at the very start of a text).
CONTEXT_TOKENS = 8


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, token_ids: list[int], params: SamplingParams) -> None:
        """token_ids: what precedes the first token to detokenize (the prompt, plus any tokens
        generated elsewhere before a migration)."""
        self.tokenizer = tokenizer
        context = list(token_ids[-CONTEXT_TOKENS:])
        # A context ending inside a multi-byte character decodes to U+FFFD, and DecodeStream would
        # then repeat the whole context once the character completes. Those trailing tokens were
        # never released as text (a stream holds a U+FFFD tail back), so they are replayed as
        # pending instead.
        pending: list[int] = []
        while context and tokenizer.decode(
                context, skip_special_tokens=params.skip_special_tokens).endswith("\ufffd"):
            pending.insert(0, context.pop())
        self.stream = DecodeStream(ids=context, skip_special_tokens=params.skip_special_tokens)
        for token_id in pending:
            self.stream.step(tokenizer, token_id)
        self.stop = params.stop
        self.hold_stops = bool(params.stop) and not params.include_stop_str_in_output
        self.include_stop = params.include_stop_str_in_output
        self.text = ""
        self.released = 0

    def add(self, token_id: int) -> str | None:
        """Appends a token. Returns the stop string it completed, if any (the text is then cut
        there)."""
        piece = self.stream.step(self.tokenizer, token_id)
        if not piece:
            return None
        search_from = max(0, len(self.text) - max(map(len, self.stop), default=0) + 1)
        self.text += piece
        hit = min(((self.text.find(s, search_from), s)
                   for s in self.stop if self.text.find(s, search_from) >= 0), default=None)
        if hit is None:
            return None
        index, stop = hit
        self.text = self.text[:index + (len(stop) if self.include_stop else 0)]
        return stop

    def release(self, final: bool) -> str:
        """Text that can no longer change, not yet handed out."""
        end = len(self.text) if final or not self.hold_stops else len(
            self.text) - self._stop_prefix_len()
        end = max(end, self.released)
        new, self.released = self.text[self.released:end], end
        return new

    def _stop_prefix_len(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stop:
            for k in range(min(len(stop) - 1, len(self.text)), best, -1):
                if self.text.endswith(stop[:k]):
                    best = k
                    break
        return best
