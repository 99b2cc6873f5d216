"""One streamed request to an OpenAI-compatible /v1/completions, timed on the client: what users see.

Every outcome is a RequestResult: answered, refused (an explicit 429/503, or an error event before any token), or
failed (anything else, including a stream that ends without [DONE]). Nothing here raises for a bad answer, so a
load test counts every request it sent.
"""
from __future__ import annotations

import json
import time
from itertools import pairwise

import httpx

from baton.loadtest.stats import FAILED, OK, REFUSED, RequestResult

# Status codes that mean "not now" by design (rate limit, admission control, overload), not a broken server.
REFUSAL_STATUSES = (429, 503)


def completion_body(model: str, prompt: list[int] | str, max_tokens: int) -> dict[str, object]:
    # ignore_eos makes the output exactly max_tokens long on servers that support it (vLLM, Baton), so the work
    # per request is the workload's, not the random model's; usage gives the count on servers that ignore it.
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0.0, "stream_options": {"include_usage": True}}


class _Stream:
    """Token arrival times of one streamed completion."""

    def __init__(self, sent: float) -> None:
        self.sent = sent
        self.token_times: list[float] = []
        self.usage_tokens: int | None = None
        self.done = False
        self.error: dict | None = None

    def feed(self, data: str, now: float) -> None:
        if data == "[DONE]":
            self.done = True
            return
        chunk = json.loads(data)
        if "error" in chunk:
            self.error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            return
        if chunk.get("usage"):
            self.usage_tokens = chunk["usage"].get("completion_tokens")
        for choice in chunk.get("choices") or []:
            # A chunk that only closes the stream (no text, a finish reason) carries no token; any other does,
            # even with empty text (a token whose bytes the detokenizer is still holding).
            if choice.get("text") or choice.get("finish_reason") is None:
                self.token_times.append(now)

    def result(self, start_s: float, prompt_tokens: int) -> RequestResult:
        times = self.token_times
        if self.error is not None:
            status = REFUSED if not times else FAILED
            return RequestResult(start_s, status, prompt_tokens=prompt_tokens,
                                 error=f"{self.error.get('code')}: {self.error.get('message')}")
        if not self.done or not times:
            return RequestResult(start_s, FAILED, prompt_tokens=prompt_tokens,
                                 error="stream ended without [DONE]" if not self.done else "no tokens")
        tokens = self.usage_tokens if self.usage_tokens else len(times)
        return RequestResult(start_s, OK, ttft_s=times[0] - self.sent, e2e_s=times[-1] - self.sent,
                             itls_s=[b - a for a, b in pairwise(times)], output_tokens=tokens,
                             prompt_tokens=prompt_tokens)


async def send_completion(client: httpx.AsyncClient, url: str, model: str, prompt: list[int] | str,
                          max_tokens: int, origin: float, api_key: str | None = None,
                          prompt_tokens: int = 0) -> RequestResult:
    """Streams one completion from `url` (…/v1). start_s in the result is seconds since `origin` (perf_counter)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    sent = time.perf_counter()
    stream = _Stream(sent)
    try:
        async with client.stream("POST", f"{url.rstrip('/')}/completions", headers=headers,
                                 json=completion_body(model, prompt, max_tokens)) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:300]
                status = REFUSED if response.status_code in REFUSAL_STATUSES else FAILED
                return RequestResult(sent - origin, status, prompt_tokens=prompt_tokens,
                                     error=f"HTTP {response.status_code}: {text}")
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    stream.feed(line[5:].strip(), time.perf_counter())
                    if stream.done:
                        break
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        return RequestResult(sent - origin, FAILED, prompt_tokens=prompt_tokens, error=f"{type(e).__name__}: {e}")
    return stream.result(sent - origin, prompt_tokens)
