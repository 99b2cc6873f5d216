"""`baton serve` disaggregated with the pools at different tensor-parallel sizes: a prefill worker
at TP=2 handing its KV to a decode worker at TP=1, and TP=1 to TP=2, answer through the official
client exactly what the engine at TP=1 answers. The embedded model has 2 KV heads, so at TP=2
they split: each decode rank reads its head from the prefill rank that holds it (or both halves
from one rank), with both pools' caches head-major (HND), or one of each order. The decode worker
fails a request whose KV read fails (no quiet recompute), and its metrics show the KV bytes
moved."""
from __future__ import annotations

import asyncio

import openai
import pytest

from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.offline import run_requests
from tests.launcher import ServeCommand, scrape, wait_for

# Several blocks of KV each (16 tokens a block), so the reads span blocks.
PROMPTS = [f"Tale {i}: in a land far away, beyond the hills and the rivers and the old "
           "forests, there lived a" for i in range(4)]
TOKENS = 16
# Three engine processes and five with the router and gateway, on two cores.
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    """The embedded model's greedy texts at TP=1, through the same OpenAI protocol code."""
    engine = LLMEngine(EngineConfig(dtype="float32", device="cpu", num_kv_blocks=256))
    bodies = [{"prompt": p, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True}
              for p in PROMPTS]
    try:
        results = run_requests(engine, [("/v1/completions", b) for b in bodies])
    finally:
        engine.close()
    return {p: r["choices"][0]["text"] for p, r in zip(PROMPTS, results)}


async def _answers(url: str) -> dict[str, str]:
    client = openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300)

    async def one(prompt: str) -> str:
        stream = await client.completions.create(model="tiny-llama", prompt=prompt,
                                                 max_tokens=TOKENS, temperature=0, stream=True,
                                                 extra_body={"ignore_eos": True})
        return "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])

    return dict(zip(PROMPTS, await asyncio.gather(*(one(p) for p in PROMPTS))))


# A rank of one KV head is both orders (engine/kv/layout.py:order_of). Token-major caches on both
# sides read a piece per token: tests/worker/test_head_ranges.py.
@pytest.mark.parametrize("prefill_tp,decode_tp,layouts", [
    (2, 1, ("HND", "HND")),  # the decode rank reads one piece per (layer, block, K/V) and rank
    (1, 2, ("NHD", "HND")),  # across orders: a piece per (token, head), still exact
])
def test_disaggregated_across_tp_sizes_answers_as_tp1(expected, prefill_tp, decode_tp, layouts):
    serve = ServeCommand("--mode", "disaggregated", "--dtype", "float32",
                         "--gateway-arg=--slos=", "--worker-arg=--num-kv-blocks=256",
                         f"--prefill-worker-arg=--kv-cache-layout={layouts[0]}",
                         f"--decode-worker-arg=--kv-cache-layout={layouts[1]}",
                         "--router-arg=--max-local-prefill-tokens=0",  # every prompt hands off
                         f"--prefill-worker-arg=-tp={prefill_tp}",
                         f"--decode-worker-arg=-tp={decode_tp}",
                         "--decode-worker-arg=--transfer-failure-policy=fail")
    try:
        wait_for(lambda: serve.ready.is_set() or serve.process.poll() is not None, timeout=900,
                 what="baton serve ready")
        assert serve.ready.is_set(), "\n".join(serve.lines)
        assert asyncio.run(_answers(serve.url)) == expected
        [metrics_port] = serve.decode_workers().values()
        moved = scrape(f"http://127.0.0.1:{metrics_port}/metrics",
                       "baton_kv_transfer_bytes_total")
        assert moved > 0
    finally:
        serve.stop()
