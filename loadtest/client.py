"""One streamed request to an OpenAI-compatible /v1/completions, timed on the client: what users
see.

Every outcome is a RequestResult: answered, refused (an explicit 429/503, or an error event before
any token), or failed (anything else, including a stream that ends without [DONE]). Nothing here
raises for a bad answer, so a load test counts every request it sent.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import httpx

from baton.loadtest.scenarios import LoadRequest
from baton.loadtest.stats import FAILED, OK, REFUSED, RequestResult

# Status codes that mean "not now" by design (rate limit, admission control, overload), not a broken
# server.
REFUSAL_STATUSES = (429, 503)
PromptOf = Callable[[LoadRequest], "list[int] | str"]


@dataclass(frozen=True)
class Target:
    url: str  # …/v1
    model: str
    api_key: str | None = None
    # ids, or text for servers that take no token ids
    prompt_of: PromptOf = lambda request: request.prompt
    # ignore_eos makes the output exactly max_tokens long on servers that support it (vLLM, Baton),
    # so the work per request is the workload's, not the random model's. Servers that refuse unknown
    # fields (`transformers serve`) need it off; usage then gives the real count.
    ignore_eos: bool = True


def completion_body(target: Target, prompt: list[int] | str, max_tokens: int) -> dict[str, object]:
    body = {
        "model": target.model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
        "temperature": 0.0, "stream_options": {"include_usage": True}
    }
    if target.ignore_eos:
        body["ignore_eos"] = True
    return body


class StreamTimes:
    """Token arrival times of one streamed completion."""

    def __init__(self, sent: float) -> None:
        self.sent = sent
        self.token_times: list[float] = []
        self.usage_tokens: int | None = None
        self.usage_prompt_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.done = False
        self.finish_reason: str | None = None
        self.error: dict | None = None

    def feed(self, data: str, now: float) -> None:
        if data == "[DONE]":
            self.done = True
            return
        chunk = json.loads(data)
        if "error" in chunk:
            self.error = chunk["error"] if isinstance(chunk["error"],
                                                      dict) else {"message": str(chunk["error"])}
            return
        if usage := chunk.get("usage"):
            self.usage_tokens = usage.get("completion_tokens")
            self.usage_prompt_tokens = usage.get("prompt_tokens")
            self.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        for choice in chunk.get("choices") or []:
            # A chunk that only closes the stream (no text, a finish reason) carries no token; any
            # other does, even with empty text (a token whose bytes the detokenizer is still
            # holding). So does a closing chunk with nothing before it: a one-token answer whose
            # token has no text of its own.
            if choice.get("text") or choice.get("finish_reason") is None or not self.token_times:
                self.token_times.append(now)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason

    def result(self, start_s: float, prompt_tokens: int) -> RequestResult:
        times = self.token_times
        if self.error is not None:
            status = REFUSED if not times else FAILED
            return RequestResult(start_s, status, prompt_tokens=prompt_tokens,
                                 error=f"{self.error.get('code')}: {self.error.get('message')}")
        # Some servers (`transformers serve`) close the stream after the finish reason without
        # sending [DONE].
        if not (self.done or self.finish_reason) or not times:
            return RequestResult(
                start_s, FAILED, prompt_tokens=prompt_tokens,
                error="stream ended without a finish reason or [DONE]" if times else "no tokens")
        # The server's counts, where it gives them, are what it processed (text prompts are
        # tokenized there).
        return RequestResult(start_s, OK, ttft_s=times[0] - self.sent, e2e_s=times[-1] - self.sent,
                             itls_s=[b - a for a, b in pairwise(times)],
                             output_tokens=self.usage_tokens or len(times),
                             prompt_tokens=self.usage_prompt_tokens or prompt_tokens,
                             cached_tokens=self.cached_tokens)


async def send_completion(client: httpx.AsyncClient, target: Target, prompt: list[int] | str,
                          max_tokens: int, origin: float, prompt_tokens: int = 0) -> RequestResult:
    """Streams one completion from the target. start_s in the result is seconds since `origin`
    (perf_counter)."""
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    sent = time.perf_counter()
    stream = StreamTimes(sent)
    try:
        async with client.stream("POST", f"{target.url.rstrip('/')}/completions", headers=headers,
                                 json=completion_body(target, prompt, max_tokens)) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:300]
                status = REFUSED if response.status_code in REFUSAL_STATUSES else FAILED
                return RequestResult(
                    sent - origin, status, prompt_tokens=prompt_tokens,
                    error=f"HTTP {response.status_code}: {text}",
                    refusal_s=time.perf_counter() - sent if status == REFUSED else None)
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    stream.feed(line[5:].strip(), time.perf_counter())
                    if stream.done:
                        break
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        return RequestResult(sent - origin, FAILED, prompt_tokens=prompt_tokens,
                             error=f"{type(e).__name__}: {e}")
    return stream.result(sent - origin, prompt_tokens)
