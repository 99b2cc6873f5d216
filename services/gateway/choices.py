"""A choice's state as the workers' messages arrive. Text comes detokenized from the workers (stop
strings resolved there); the OpenAI bodies made from it are services/openai/render.py's and
streaming.py's."""
from __future__ import annotations

from baton.services.common.wire.worker import (logprob_from_proto, prompt_logprobs_from_proto,
                                               stop_reason_of)
from baton.services.openai.render import Choice
from baton.services.openai.streaming import Delta
from baton.v1 import worker_pb2 as pb


class ChoiceState(Choice):
    """A Choice filled from GenerateResponse messages; its logprobs start as [] when asked for, else
    None."""

    def add(self, message: pb.GenerateResponse) -> Delta:
        """Folds a message in; returns what it added (for the streamed chunk)."""
        self.token_ids += message.token_ids
        self.text += message.text
        new = [logprob_from_proto(lp) for lp in message.logprobs]
        if self.logprobs is not None:
            self.logprobs += new
        self.num_cached_tokens = max(self.num_cached_tokens, message.num_cached_tokens)
        if message.prompt_logprobs and self.prompt_logprobs is None:
            self.prompt_logprobs = prompt_logprobs_from_proto(message.prompt_logprobs)
        if message.finished:
            self.finish_reason = message.finish_reason or None
            self.stop_reason = stop_reason_of(message)
        return Delta(message.text, list(message.token_ids), new, message.finished)
