"""The load-test client's reading of a streamed completion, fed server-sent events as vLLM, Baton
and `transformers serve` write them."""
from __future__ import annotations

import json

import pytest

from baton.loadtest.client import StreamTimes, Target, completion_body
from baton.loadtest.stats import FAILED, OK, REFUSED


def chunk(text: str | None = None, finish: str | None = None, usage: dict | None = None) -> str:
    choices = [] if text is None and finish is None else [{
        "index": 0, "text": text or "", "finish_reason": finish
    }]
    return json.dumps({"choices": choices, **({"usage": usage} if usage else {})})


def fed(events: list[tuple[float, str]]) -> StreamTimes:
    stream = StreamTimes(sent=10.0)
    for at, data in events:
        stream.feed(data, at)
    return stream


def test_tokens_usage_and_cached_tokens_are_read_from_a_vllm_style_stream():
    usage = {
        "prompt_tokens": 40, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 32}
    }
    stream = fed([(10.5, chunk("a")), (10.6, chunk("b")), (10.8, chunk("c")),
                  (10.8, chunk("", "length")), (10.8, chunk(usage=usage)), (10.9, "[DONE]")])
    r = stream.result(start_s=1.0, prompt_tokens=37)
    assert r.status == OK
    assert r.ttft_s == pytest.approx(0.5) and r.e2e_s == pytest.approx(0.8)
    assert r.itls_s == pytest.approx([0.1, 0.2])
    assert (r.output_tokens, r.prompt_tokens, r.cached_tokens) == (3, 40, 32)


def test_a_stream_closed_after_its_finish_reason_without_done_is_answered():
    # transformers serve ends with the finish reason and usage, and no [DONE].
    stream = fed([(10.1, chunk("a")),
                  (10.2, chunk("", "length", {"prompt_tokens": 5, "completion_tokens": 1}))])
    r = stream.result(start_s=0.0, prompt_tokens=5)
    assert r.status == OK and r.cached_tokens is None


def test_a_one_token_answer_without_text_is_answered_at_its_closing_chunk():
    # The token is a lone byte of a multi-byte character: its text stays empty, its chunk also
    # closes the stream.
    usage = {"prompt_tokens": 5, "completion_tokens": 1}
    r = fed([(10.3, chunk("", "length")), (10.3, chunk(usage=usage)),
             (10.3, "[DONE]")]).result(0.0, 5)
    assert r.status == OK and r.ttft_s == pytest.approx(0.3) and r.output_tokens == 1


def test_a_stream_cut_before_any_finish_reason_fails():
    r = fed([(10.1, chunk("a")), (10.2, chunk("b"))]).result(0.0, 5)
    assert r.status == FAILED and "finish reason" in r.error


def test_an_error_event_before_any_token_is_a_refusal_and_after_one_a_failure():
    error = json.dumps({"error": {"code": 503, "message": "overloaded"}})
    assert fed([(10.1, error)]).result(0.0, 5).status == REFUSED
    assert fed([(10.1, chunk("a")), (10.2, error)]).result(0.0, 5).status == FAILED


def test_ignore_eos_is_sent_only_when_wanted():
    assert completion_body(Target("u", "m"), [1, 2], 8)["ignore_eos"] is True
    assert "ignore_eos" not in completion_body(Target("u", "m", ignore_eos=False), [1, 2], 8)
