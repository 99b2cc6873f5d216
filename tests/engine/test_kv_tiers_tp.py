"""The host KV tier at tensor parallelism 2 on CPU (gloo): each rank keeps its own heads' share of
every block, following rank 0's stores and loads, so conversations whose first turns were evicted
from a small device cache come back from host memory with TP=1's tokens (without tiers), through a
host tier small enough that its slots are reused; swap preemption too; the disk tier refused."""
from __future__ import annotations

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from tests.engine.tiers_helpers import conversations, engine, gib_for, two_turns

PROMPTS = conversations(4)
CPU = dict(dtype="float32", device="cpu", num_threads=1, max_model_len=256)


@pytest.fixture(scope="module")
def reference(tiny_model_dirs) -> tuple[list[list[int]], float]:
    """TP=1's outputs without tiers, and a host setting of 24 of its blocks (48 of a TP=2 rank's,
    each holding half the heads): less than the conversations' KV, so slots are reused."""
    e = engine(model=str(tiny_model_dirs["llama"]), **CPU)
    try:
        outputs, _ = two_turns(e, PROMPTS)
        return outputs, gib_for(e, 24)
    finally:
        e.close()


def test_tp2_host_tier_outputs_equal_tp1_without_tiers(tiny_model_dirs, reference) -> None:
    outputs, host_gib = reference
    e = engine(model=str(tiny_model_dirs["llama"]), tensor_parallel_size=2,
               kv_offload_host_gib=host_gib, **CPU)
    try:
        got, cached = two_turns(e, PROMPTS)
        assert e.tiers.flush()
        assert got == outputs
        host = e.tiers.stats["host"]
        assert host.hits > 0 and host.blocks_loaded > 0
        # More blocks went to host memory than it has slots: rank 0's evictions were followed.
        assert host.blocks_stored > e.tiers.host.capacity
        assert sum(cached) > e.scheduler.stats.prefix_cache_hits
    finally:
        e.close()


def test_tp2_swap_preemption_equals_tp1_recompute(tiny_model_dirs, reference) -> None:
    model = str(tiny_model_dirs["llama"])
    long = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = engine(model=model, max_num_seqs=8, **CPU)
    try:
        expected = [o.token_ids for o in plain.generate(PROMPTS, long)]
    finally:
        plain.close()
    swap = engine(model=model, max_num_seqs=8, tensor_parallel_size=2,
                  kv_offload_host_gib=reference[1], **CPU)
    try:
        assert [o.token_ids for o in swap.generate(PROMPTS, long)] == expected
        assert swap.scheduler.stats.preemptions_swapped > 0
        assert swap.tiers.stats["host"].blocks_loaded > 0
    finally:
        swap.close()


def test_disk_tier_at_tp2_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="disk KV tier .* --tensor-parallel-size > 1 is not "
                                         "supported yet"):
        EngineConfig(tensor_parallel_size=2, kv_offload_host_gib=1.0,
                     kv_offload_disk_dir=str(tmp_path))
