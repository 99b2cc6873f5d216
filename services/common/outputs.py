"""What the engine hands back per request and step.

A streaming consumer reads the deltas (new_token_ids, new_logprobs, new_text). The histories
(token_ids, logprobs, text) are read from the request's own growing state only when asked for, so a
step costs the same whatever the request's length: nothing is copied per token. Both are exact
snapshots as of the step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TokenLogprobs:
    """Log-probabilities at one generated position, from the model's raw distribution."""
    token_id: int
    logprob: float
    rank: int  # 1-based rank of the chosen token
    top: dict[int, float] = field(default_factory=dict)  # top-k token id -> logprob, best first


class _Snapshot:
    """owner.attr[start:end], read on first use. The attribute is a history that only grows (or, for
    text, only loses what was never released), so the slice is what it was when taken. An object
    with four slots rather than a closure: the engine makes three per token, and closures (function,
    cells, tuple) multiply the objects the garbage collector has to walk."""
    __slots__ = ("owner", "attr", "start", "end")

    def __init__(self, owner: Any, attr: str, start: int, end: int) -> None:
        self.owner, self.attr, self.start, self.end = owner, attr, start, end

    def _read(self) -> Any:
        return getattr(self.owner, self.attr)[self.start:self.end]


class RequestOutput:

    def __init__(self, request_id: str, prompt_token_ids: list[int],
                 token_ids: list[int] | _Snapshot, text: str | _Snapshot, num_new_tokens: int,
                 new_text: str, finished: bool = False, finish_reason: str | None = None,
                 stop_reason: int | str | None = None,
                 logprobs: list[TokenLogprobs] | _Snapshot | None = None,
                 num_cached_tokens: int = 0, new_token_ids: list[int] | None = None,
                 new_logprobs: list[TokenLogprobs] | None = None,
                 prompt_logprobs: list[TokenLogprobs | None] | None = None) -> None:
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.num_new_tokens = num_new_tokens  # how many tokens arrived in this step
        self.new_text = new_text  # the text released in this step
        self.finished = finished
        self.finish_reason = finish_reason  # "stop" | "length" | "abort"
        self.stop_reason = stop_reason  # the stop token id or stop string that ended it
        self.num_cached_tokens = num_cached_tokens  # prompt tokens served from the prefix cache
        # Asked-for prompt logprobs, one per prompt token (the first has none); carried once, by the
        # first output after the whole prompt ran.
        self.prompt_logprobs = prompt_logprobs
        self._token_ids, self._text, self._logprobs = token_ids, text, logprobs
        if new_token_ids is None:
            new_token_ids = self.token_ids[len(self.token_ids) - num_new_tokens:]
        if new_logprobs is None and self.logprobs is not None:
            new_logprobs = self.logprobs[len(self.logprobs) - num_new_tokens:]
        self.new_token_ids = new_token_ids
        self.new_logprobs = new_logprobs

    def then(self, later: "RequestOutput") -> "RequestOutput":
        """This output and the request's next one as one: the deltas of both, the state of the
        later (a consumer that fell behind sends one message where it had two)."""
        new_logprobs = None if self.new_logprobs is None or later.new_logprobs is None else [
            *self.new_logprobs, *later.new_logprobs]
        return RequestOutput(
            self.request_id, self.prompt_token_ids, later._token_ids, later._text,
            self.num_new_tokens + later.num_new_tokens, self.new_text + later.new_text,
            later.finished, later.finish_reason, later.stop_reason, later._logprobs,
            later.num_cached_tokens, [*self.new_token_ids, *later.new_token_ids], new_logprobs,
            self.prompt_logprobs if self.prompt_logprobs is not None else later.prompt_logprobs)

    @staticmethod
    def snapshot(owner: Any, attr: str, start: int, end: int) -> _Snapshot:
        """owner.attr[start:end] as it is now, read only if asked for (see _Snapshot)."""
        return _Snapshot(owner, attr, start, end)

    @property
    def token_ids(self) -> list[int]:
        """Every generated token so far."""
        if isinstance(self._token_ids, _Snapshot):
            self._token_ids = self._token_ids._read()
        return self._token_ids

    @property
    def text(self) -> str:
        """Detokenized output so far, stop string removed when it ended the request."""
        if isinstance(self._text, _Snapshot):
            self._text = self._text._read()
        return self._text

    @property
    def logprobs(self) -> list[TokenLogprobs] | None:
        if isinstance(self._logprobs, _Snapshot):
            self._logprobs = self._logprobs._read()
        return self._logprobs

    def __repr__(self) -> str:
        return (
            f"RequestOutput(request_id={self.request_id!r}, new_token_ids={self.new_token_ids}, "
            f"new_text={self.new_text!r}, finished={self.finished}, "
            f"finish_reason={self.finish_reason!r})"
        )
