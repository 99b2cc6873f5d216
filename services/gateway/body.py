"""Reading a request's JSON body within limits: its size is checked before it is read (a declared
Content-Length) and while it arrives (a chunked body), and its nesting depth before it is parsed, so
an oversized or absurdly nested body costs neither memory nor a recursion error."""
from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
from fastapi import Request

from baton.services.openai.errors import ProtocolError

# A JSON string, escapes included: what lies inside one is not structure.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
# bracket byte -> +1 (opens) or -1 (closes); only these four bytes are looked up
_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def _too_large(limit: int) -> ProtocolError:
    return ProtocolError(f"the request body is larger than this server accepts ({limit} bytes)",
                         code="request_too_large", status=413)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) without reading further as soon as it is known to exceed `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def nesting_depth(raw: bytes) -> int:
    """How deeply arrays and objects nest in a JSON text, counted without recursion: strings are cut
    out, then the brackets' running balance is summed by numpy."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    return int(np.cumsum(_STEP[np.frombuffer(brackets, dtype=np.uint8)], dtype=np.int64).max())


def parse_json(raw: bytes, max_depth: int) -> Any:
    """The parsed body; ProtocolError (400) for invalid UTF-8 or JSON, or nesting beyond
    max_depth."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(f"the request body is not valid UTF-8: {e}",
                            code="invalid_encoding") from None
    depth = nesting_depth(raw)
    if depth > max_depth:
        raise ProtocolError(
            f"the request body nests arrays and objects {depth} deep; at most {max_depth} is "
            "accepted", code="invalid_json")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ProtocolError(f"the request body is not valid JSON: {e}",
                            code="invalid_json") from None
