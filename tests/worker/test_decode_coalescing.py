"""A decode stream whose event loop falls behind the engine sends the waiting tokens as one
message."""
from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from baton.services.common.outputs import RequestOutput
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.requests import EngineRequest
from baton.services.worker.config import WorkerConfig
from baton.services.worker.decode import DecodeSide
from baton.services.worker.engine_loop import EngineLoop
from baton.services.worker.metrics import WorkerMetrics

PROMPT = list(range(20, 40))
TOKENS = 24


async def stream_with_a_stall(engine: LLMEngine, params: SamplingParams) -> list[RequestOutput]:
    loop = EngineLoop(engine, asyncio.get_running_loop())
    loop.start()
    side = DecodeSide(WorkerConfig(), loop, None, WorkerMetrics(CollectorRegistry(), "m"))
    messages: list[RequestOutput] = []
    try:
        async for served in side.generate(EngineRequest("r", PROMPT, params), None, []):
            messages.append(served.output)
            if len(messages) == 1:
                time.sleep(1.0)  # the event loop is blocked; the engine thread goes on generating
    finally:
        loop.stop()
    return messages


def test_tokens_waiting_for_a_busy_event_loop_go_out_as_one_message(tiny_model_dirs):
    engine = LLMEngine(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=64))
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True, logprobs=1)
    messages = asyncio.run(stream_with_a_stall(engine, params))
    [expected] = engine.generate([PROMPT], params)

    assert [t for m in messages for t in m.new_token_ids] == expected.token_ids
    assert "".join(m.new_text for m in messages) == expected.text
    assert [lp.token_id for m in messages for lp in m.new_logprobs] == expected.token_ids
    assert len(messages) < TOKENS and max(m.num_new_tokens for m in messages) > 1
    assert messages[-1].finished and not any(m.finished for m in messages[:-1])
