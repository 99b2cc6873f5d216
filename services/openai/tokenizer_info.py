"""vLLM's /tokenizer_info: the tokenizer's configuration as tokenizer_config.json holds it (the
arguments it was built with), its class and chat template, so a client can build the same
tokenizer on its side."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from transformers import PreTrainedTokenizerBase

# Where the server keeps the tokenizer's files: nothing a client can use (vLLM leaves them out too).
FILE_FIELDS = frozenset({"vocab_file", "merges_file", "tokenizer_file"})


class TokenizerInfoResponse(BaseModel):
    """tokenizer_config.json's keys beside tokenizer_class (vLLM's shape)."""
    model_config = ConfigDict(extra="allow")
    tokenizer_class: str


def _plain(value: Any) -> Any:
    """A JSON value: special tokens (AddedToken) as their text, containers walked, anything else
    that JSON has no type for as its str()."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    content = getattr(value, "content", None)
    return content if isinstance(content, str) else str(value)


def tokenizer_info(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    info = {k: _plain(v) for k, v in tokenizer.init_kwargs.items() if k not in FILE_FIELDS}
    info["tokenizer_class"] = type(tokenizer).__name__
    if tokenizer.chat_template:
        info["chat_template"] = tokenizer.chat_template
    return TokenizerInfoResponse(**info).model_dump()
