"""Worker processes with a random EAGLE head: a prefill worker hands its prompts' KV, the head's
with it, to a decode worker over the gRPC transport, and the decode worker drafts and accepts as
an engine with the same head does alone (sequential requests: the same batches on both)."""
from __future__ import annotations

import asyncio
import json

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from tests.engine.eagle_helpers import make_head
from tests.engine.engine_helpers import random_prompts
from tests.launcher import start_workers, stop_all
from tests.worker.streams import collect, greedy_params

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def spec(tiny_model_dirs, tmp_path_factory) -> str:
    head = make_head(tiny_model_dirs["llama"], tmp_path_factory.mktemp("worker-eagle") / "head",
                     False)
    return json.dumps({"method": "eagle", "model": str(head), "num_speculative_tokens": 3})


@pytest.fixture(scope="module")
def workers(tiny_model_dirs, spec):
    started = start_workers(tiny_model_dirs["llama"], ["prefill", "decode"], "grpc",
                            f"--speculative-config={spec}")
    yield started
    stop_all([w.service for w in started])


async def _sequential(decode, prefill, prompts) -> list[tuple[list[int], str]]:
    return [await collect(decode, prefill, f"eagle-{i}", p, greedy_params(NEW_TOKENS))
            for i, p in enumerate(prompts)]


def test_decode_worker_drafts_as_a_colocated_engine(tiny_model_dirs, spec, workers):
    prefill, decode = workers
    prompts = random_prompts(3, vocab_size=500, seed=13, min_len=6, max_len=30)
    alone = LLMEngine(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=256,
                                   speculative_config=spec))
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    want = [alone.generate([p], params)[0].token_ids for p in prompts]
    handed = asyncio.run(_sequential(decode, prefill, prompts))
    assert [tokens for tokens, _ in handed] == want
    assert {source for _, source in handed} == {"transfer"}
    stats = alone.speculator.stats
    assert [decode.metric(f"baton_spec_decode_{c}_total") for c in (
        "num_drafts", "num_draft_tokens", "num_accepted_tokens")] == [
            stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens]
    assert stats.num_drafts > 0
    assert prefill.metric("baton_spec_decode_num_drafts_total") == 0
