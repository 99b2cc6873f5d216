"""KV tiers below the device cache (services/engine/kv/tiers): with a host tier, and a disk tier
under it, greedy outputs equal those without; what the tiers serve is counted as cached tokens and
not recomputed; swap preemption brings a victim's blocks back from host memory; the host tier never
holds more than its setting."""
from __future__ import annotations

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from tests.engine.tiers_helpers import GIB, conversations, engine, gib_for, two_turns

PROMPTS = conversations()


@pytest.fixture(scope="module")
def reference() -> tuple[list[list[int]], int, float, int]:
    """Outputs without tiers, prompt tokens computed, a host setting of 400 blocks, and the second
    turns' cached tokens."""
    e = engine()
    outputs, cached = two_turns(e, PROMPTS)
    return outputs, e.counters.prompt_tokens_computed, gib_for(e, 400), sum(cached)


def test_host_tier_outputs_equal_and_fewer_tokens_computed(reference) -> None:
    outputs, computed, host_gib, device_cached = reference
    e = engine(kv_offload_host_gib=host_gib)
    try:
        got, cached = two_turns(e, PROMPTS)
        e.close()  # every copy done
        assert got == outputs
        host = e.tiers.stats["host"]
        assert host.hits > 0 and host.blocks_loaded > 0
        # The second turns' histories come back from host memory: counted as cached, not computed.
        assert sum(cached) >= device_cached + 4 * 16
        assert e.counters.prompt_tokens_computed < computed
        assert e.scheduler.stats.prefix_cache_hits < host.hits  # the device cache alone is small
    finally:
        e.close()


def test_swap_preemption_outputs_equal_recompute(reference) -> None:
    """Long outputs in a small cache preempt; swap brings the victims' blocks back from host."""
    params = {"max_num_seqs": 8}
    long = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    recompute = engine(**params)
    expected = [o.token_ids for o in recompute.generate(PROMPTS, long)]
    assert recompute.scheduler.stats.preemptions > 0
    swap = engine(kv_offload_host_gib=reference[2], **params)
    try:
        assert [o.token_ids for o in swap.generate(PROMPTS, long)] == expected
        swap.close()
        assert swap.scheduler.stats.preemptions_swapped == swap.scheduler.stats.preemptions > 0
        assert swap.tiers.stats["host"].blocks_loaded > 0
        assert swap.counters.prompt_tokens_computed < recompute.counters.prompt_tokens_computed
    finally:
        swap.close()
    kept = engine(kv_offload_host_gib=reference[2], preemption_mode="recompute", **params)
    try:
        assert [o.token_ids for o in kept.generate(PROMPTS, long)] == expected
        assert kept.scheduler.stats.preemptions_swapped == 0
    finally:
        kept.close()


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_disk_tier_outputs_equal(reference, tmp_path, layout) -> None:
    """A host tier of 12 blocks pushes most blocks on to disk, and they load back from there; a
    head-major cache's blocks too, its outputs the token-major reference's."""
    outputs, computed, host_gib, _ = reference
    e = engine(kv_offload_host_gib=host_gib * 12 / 400, kv_offload_disk_dir=str(tmp_path),
               kv_cache_layout=layout)
    try:
        got, cached = two_turns(e, PROMPTS)
        e.close()
        assert got == outputs
        disk = e.tiers.stats["disk"]
        assert disk.blocks_stored > 0 and disk.hits > 0 and disk.blocks_loaded > 0
        assert disk.checksum_failures == 0 and disk.write_errors == 0
        assert len(list(tmp_path.glob("*.kv"))) == disk.blocks_stored
        assert e.counters.prompt_tokens_computed < computed
    finally:
        e.close()


def test_host_memory_never_exceeds_its_setting(reference) -> None:
    setting = reference[2] * 10 / 400  # ten blocks
    e = engine(kv_offload_host_gib=setting)
    try:
        assert e.tiers.host.capacity == 10
        assert e.tiers.host.pool.numel() <= setting * GIB
        got, _ = two_turns(e, PROMPTS)
        e.close()
        assert got == reference[0]
        host = e.tiers.stats["host"]
        assert host.blocks_stored > 10  # it evicted, and stayed within its slots
        assert len(e.tiers.host) <= 10 and e.tiers.host.bytes_used <= setting * GIB
        used, allowed = e.tiers.usage()["host"]
        assert used <= allowed <= setting * GIB
    finally:
        e.close()


@pytest.mark.parametrize("settings, message", [
    ({"kv_offload_disk_dir": "/tmp/x"}, "needs a host tier"),
    ({"preemption_mode": "swap"}, "needs a host tier"),
    ({"kv_offload_host_gib": 1, "enable_prefix_caching": False}, "enable_prefix_caching"),
])
def test_inconsistent_tier_settings_are_refused(settings, message) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(**settings)
