"""An EAGLE head's KV through the KV tiers: prompts' blocks evicted from a small device cache come
back from the host tier, or from disk, with the head's KV, so the drafts of second requests on the
same prompts are those of an engine whose device cache never evicted, step for step, for a random
head (whose drafts depend on its attention over the whole prefix).

The second requests share their first prompt, not its answer: the head never computes its KV at a
finished request's last step's positions (eagle.py), so blocks holding those positions carry what
their physical blocks held before, which differs between two engines even without tiers."""
from __future__ import annotations

import json
import random

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.llm_engine import LLMEngine
from tests.engine.eagle_helpers import make_head
from tests.engine.test_speculation_draft import DraftRecorder
from tests.engine.tiers_helpers import BLOCK_SIZE, DEVICE_BLOCKS, conversations, gib_for

K = 3
PROMPTS = conversations(6)
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def two_requests(e: LLMEngine) -> tuple[list[list[int]], list[int]]:
    """Each prompt, then (all done, their blocks in the tiers) each prompt with a new question:
    every output, and the second requests' cached tokens."""
    first = e.generate(PROMPTS, PARAMS)
    if e.tiers is not None:
        assert e.tiers.flush()
    rng = random.Random(1)
    second = e.generate([p + [rng.randrange(5, 250) for _ in range(6)] for p in PROMPTS], PARAMS)
    return [o.token_ids for o in first + second], [o.num_cached_tokens for o in second]


def engine(model, head, num_kv_blocks: int = DEVICE_BLOCKS, **kwargs: object) -> LLMEngine:
    """One sequence at a time, so that every engine drafts over the same steps."""
    spec = json.dumps({"method": "eagle", "model": str(head), "num_speculative_tokens": K})
    made = LLMEngine(EngineConfig(model=str(model), block_size=BLOCK_SIZE, max_num_seqs=1,
                                  num_kv_blocks=num_kv_blocks, speculative_config=spec, **kwargs))
    made.speculator.proposer = DraftRecorder(made.speculator.proposer)
    return made


@pytest.fixture(scope="module")
def target(tiny_model_dirs):
    return tiny_model_dirs["llama"]


@pytest.fixture(scope="module")
def head(target, tmp_path_factory):
    return make_head(target, tmp_path_factory.mktemp("eagle-tiers-head"), eagle3=False)


@pytest.fixture(scope="module")
def reference(target, head):
    """Outputs, second turns' cached tokens and drafts of an engine that never evicts, and a host
    setting of 400 blocks of the small engine's cache."""
    e = engine(target, head, num_kv_blocks=400)
    outputs, cached = two_requests(e)
    assert e.scheduler.stats.prefix_cache_hits > 0
    return outputs, cached, e.speculator.proposer.drafts, gib_for(e, 400)


def assert_drafts_equal(e: LLMEngine, reference, tier: str) -> None:
    outputs, cached, drafts, _ = reference
    got, got_cached = two_requests(e)
    e.close()  # every copy done
    assert got == outputs and got_cached == cached
    stats = e.tiers.stats[tier]
    assert stats.blocks_loaded > 0 and stats.hits > 0
    # The device cache alone keeps less than the second turns found cached.
    assert e.scheduler.stats.prefix_cache_hits < sum(cached)
    assert len(drafts) >= 2 * len(PROMPTS)
    assert e.speculator.proposer.drafts == drafts


def test_host_tier_brings_back_the_heads_kv(target, head, reference) -> None:
    e = engine(target, head, kv_offload_host_gib=reference[3])
    try:
        assert_drafts_equal(e, reference, "host")
        assert e.tiers.host.head_pool is not None
    finally:
        e.close()


def test_disk_tier_brings_back_the_heads_kv(target, head, reference, tmp_path) -> None:
    """A host tier of 4 blocks pushes most blocks on to disk, in files of the head's format."""
    e = engine(target, head, kv_offload_host_gib=reference[3] * 4 / 400,
               kv_offload_disk_dir=str(tmp_path))
    try:
        assert_drafts_equal(e, reference, "disk")
        disk = e.tiers.stats["disk"]
        assert disk.checksum_failures == 0 and disk.write_errors == 0
        assert len(list(tmp_path.glob("*.kv"))) == disk.blocks_stored > 0
    finally:
        e.close()


def test_files_without_the_head_are_misses(target, head, reference, tmp_path) -> None:
    """A directory written without a head serves nothing to an engine with one."""
    tiny = reference[3] * 2 / 400
    plain = LLMEngine(EngineConfig(model=str(target), block_size=BLOCK_SIZE, max_num_seqs=1,
                                   num_kv_blocks=DEVICE_BLOCKS, kv_offload_host_gib=tiny,
                                   kv_offload_disk_dir=str(tmp_path)))
    try:
        plain.generate(PROMPTS, PARAMS)
        assert plain.tiers.flush()
        assert plain.tiers.stats["disk"].blocks_stored > 0
    finally:
        plain.close()
    e = engine(target, head, kv_offload_host_gib=tiny, kv_offload_disk_dir=str(tmp_path))
    try:
        assert len(e.tiers.disk) == 0
    finally:
        e.close()
