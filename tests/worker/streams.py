"""Small async helpers to stream requests through workers started by tests/launcher.py."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

from baton.services.common.wire.worker import params_from_proto
from baton.services.gateway.handoff_client import stream_tokens
from baton.v1 import worker_pb2 as pb
from tests.launcher import Worker


def greedy_params(max_tokens: int) -> pb.SamplingParams:
    return pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def collect(decode: Worker, prefill: Worker | None, request_id: str, prompt: Sequence[int],
                  params: pb.SamplingParams) -> tuple[list[int], str]:
    """All tokens of one request and how its prompt's KV arrived. (grpc.aio channels belong to the
    event loop that made them, so stubs are made here, inside the test's loop.)"""
    tokens, source = [], ""
    async for message in stream_tokens(decode.stub(), prefill.stub() if prefill else None,
                                       pb.RequestMeta(request_id=request_id), prompt,
                                       params_from_proto(params)):
        tokens += message.token_ids
        source = message.kv_source or source
    return tokens, source


async def run_all(decode: Worker, prefill: Worker | None, prompts: list[list[int]],
                  params: pb.SamplingParams, prefix: str) -> list[tuple[list[int], str]]:
    return await asyncio.gather(*(collect(decode, prefill, f"{prefix}-{i}", p, params)
                                  for i, p in enumerate(prompts)))
