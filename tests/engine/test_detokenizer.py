from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dirs):
    return AutoTokenizer.from_pretrained(str(tiny_model_dirs["llama"]))


def stream(tokenizer, text: str, params: SamplingParams,
           prompt: str = "Say:") -> tuple[list[str], str | None, str]:
    detok = IncrementalDetokenizer(tokenizer.backend_tokenizer,
                                   tokenizer(prompt)["input_ids"], params)
    pieces, stop = [], None
    for token in tokenizer(text, add_special_tokens=False)["input_ids"]:
        stop = detok.add(token)
        pieces.append(detok.release(final=stop is not None))
        if stop is not None:
            break
    else:
        pieces.append(detok.release(final=True))
    return pieces, stop, detok.text


@pytest.mark.parametrize("text",
                         ["plain ascii text", "naïve café", "emoji 🌍🚀 mix", "中文字符测试", "a\u200db"])
def test_multibyte_characters_are_released_whole(tokenizer, text):
    pieces, stop, full = stream(tokenizer, text, SamplingParams())
    assert "".join(pieces) == full == text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_cuts_text_and_holds_back_only_possible_starts(tokenizer):
    pieces, stop, full = stream(tokenizer, "hello world and more",
                                SamplingParams(stop=["o wor", "zzz"]))
    assert stop == "o wor"
    assert full == "hell"
    assert "".join(pieces) == "hell"
    # Nothing released ever ran past what the final text keeps.
    released = ""
    for p in pieces:
        released += p
        assert full.startswith(released)


def test_include_stop_string(tokenizer):
    _, stop, full = stream(tokenizer, "one two three",
                           SamplingParams(stop=["two"], include_stop_str_in_output=True))
    assert stop == "two" and full == "one two"


def test_text_that_only_resembles_a_stop_is_released_at_the_end(tokenizer):
    pieces, stop, full = stream(tokenizer, "the end is near", SamplingParams(stop=["end!"]))
    assert stop is None and "".join(pieces) == full == "the end is near"


@pytest.mark.parametrize("cut", range(1, 16))
def test_continuing_after_any_token_never_repeats_text(tokenizer, cut):
    """A request resumed elsewhere (migration) may resume mid-character: the text that follows is
    exactly what the first worker had not yet released."""
    ids = tokenizer.encode("héllo wörld €uro", add_special_tokens=False)
    backend = tokenizer.backend_tokenizer
    detok = IncrementalDetokenizer(backend, ids[:cut], SamplingParams())
    for token_id in ids[cut:]:
        detok.add(token_id)
    released_before = backend.decode(ids[:cut]).rstrip("\ufffd")
    assert released_before + detok.release(final=True) == "héllo wörld €uro"
