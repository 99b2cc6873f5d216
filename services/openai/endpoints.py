"""Which request model each OpenAI endpoint takes, and the ids of its responses. An endpoint added
is a module with its request model, a line here, a chunk writer in streaming and a route in the
gateway's routes/. (The Responses API is served as the chat completion it amounts to:
responses.py.)"""
from __future__ import annotations

import uuid
from typing import Any

from baton.services.openai.chat import ChatCompletionRequest
from baton.services.openai.common import BaseRequest
from baton.services.openai.completions import CompletionRequest
from baton.services.openai.errors import ProtocolError

OpenAIRequest = CompletionRequest | ChatCompletionRequest
ENDPOINTS: dict[str, type[BaseRequest]] = {"/v1/completions": CompletionRequest,
                                           "/v1/chat/completions": ChatCompletionRequest}


def parse_request(url: str, body: Any, strict: bool = False) -> OpenAIRequest:
    """The request model for an endpoint path, validated; raises ProtocolError. Unknown fields are
    dropped (listed in its ignored_fields), or refused when `strict`."""
    cls = ENDPOINTS.get(url)
    if cls is None:
        raise ProtocolError(f"unsupported url {url!r}; expected one of {sorted(ENDPOINTS)}",
                            param="url", code="invalid_url")
    return cls.parse(body, strict)


def new_response_id(request: OpenAIRequest) -> str:
    prefix = "chatcmpl" if isinstance(request, ChatCompletionRequest) else "cmpl"
    return f"{prefix}-{uuid.uuid4().hex}"
