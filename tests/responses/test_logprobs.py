"""`include: ["message.output_text.logprobs"]` and `top_logprobs` on the Responses API, through the
official openai client: the message's tokens with their logprobs and alternatives, equal to those
chat completions gives for the same conversation (one chat template, one engine), streamed as the
deltas' logprobs, and absent unless asked for."""
from __future__ import annotations

import pytest

from baton.services.openai.responses import OUTPUT_LOGPROBS
from tests.responses.conftest import MODEL, client

PROMPT = "Count with me: one, two"
ASK = dict(model=MODEL, input=PROMPT, max_output_tokens=6, temperature=0, store=False)


def _entries(logprobs) -> list[tuple[str, float, list[tuple[str, float]]]]:
    return [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs])
            for e in logprobs]


def _close(got, expected) -> None:
    assert [(t, [a for a, _ in top]) for t, _, top in got] == \
        [(t, [a for a, _ in top]) for t, _, top in expected]
    flat = [v for _, lp, top in got for v in [lp, *(x for _, x in top)]]
    want = [v for _, lp, top in expected for v in [lp, *(x for _, x in top)]]
    assert flat == pytest.approx(want, abs=1e-4)


@pytest.fixture(scope="module")
def chat_reference(stack) -> list[tuple[str, float, list[tuple[str, float]]]]:
    done = client(stack.url).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPT}], max_completion_tokens=6,
        temperature=0, logprobs=True, top_logprobs=2)
    return _entries(done.choices[0].logprobs.content)


def test_output_text_carries_the_chat_logprobs(stack, chat_reference):
    created = client(stack.url).responses.create(**ASK, include=[OUTPUT_LOGPROBS], top_logprobs=2)
    [part] = created.output[0].content
    got = _entries(part.logprobs)
    assert len(got) == created.usage.output_tokens and all(len(t) == 2 for *_, t in got)
    _close(got, chat_reference)


def test_streamed_deltas_carry_the_same_logprobs(stack, chat_reference):
    deltas, done, final = [], None, None
    with client(stack.url).responses.stream(**ASK, include=[OUTPUT_LOGPROBS],
                                            top_logprobs=2) as events:
        for event in events:
            if event.type == "response.output_text.delta":
                deltas += event.logprobs
            elif event.type == "response.output_text.done":
                done = event.logprobs
            elif event.type in ("response.completed", "response.incomplete"):
                final = event.response.output[0].content[0].logprobs
    _close(_entries(deltas), chat_reference)
    _close(_entries(done), chat_reference)
    _close(_entries(final), chat_reference)


def test_no_logprobs_unless_asked(stack):
    created = client(stack.url).responses.create(**ASK)
    assert created.output[0].content[0].logprobs == []
