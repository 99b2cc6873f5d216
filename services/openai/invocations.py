"""SageMaker's /invocations: one route for every kind of request, told apart by the body's shape
(as vLLM tells them apart by which request model validates). This server generates text, so a
body is a chat completion (`messages`) or a completion (`prompt`); the pooling kinds vLLM also
takes there are refused with a 400 that says which kind the body looks like."""
from __future__ import annotations

from typing import Any

from baton.services.openai.errors import ProtocolError

# vLLM's other invocation kinds, by a field only they carry, in the order vLLM tries them.
NOT_SERVED = (("input", "an embeddings request"), ("documents", "a rerank request"),
              ("text_1", "a score request"), ("data", "a pooling request"))
SERVED = "chat completions (a body with `messages`) and completions (a body with `prompt`)"


def invocation_url(body: Any) -> str:
    """The endpoint that serves this body; raises ProtocolError when none does."""
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object", param="body")
    if "messages" in body:
        return "/v1/chat/completions"
    if "prompt" in body:
        return "/v1/completions"
    for field, kind in NOT_SERVED:
        if field in body:
            raise ProtocolError(
                f"this looks like {kind} (`{field}`), which this server does not serve: "
                f"/invocations serves {SERVED}", param=field, code="unsupported_request")
    raise ProtocolError(f"cannot tell what this request is: /invocations serves {SERVED}",
                        param="body", code="unsupported_request")
