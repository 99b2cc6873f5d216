"""The KV tiers at tensor parallelism 2 on CPU (gloo): each rank keeps its own heads' share of
every block, following rank 0's stores and loads, so conversations whose first turns were evicted
from a small device cache come back from host memory, or from disk below a host tier of a few
blocks, with TP=1's tokens (without tiers), through a host tier small enough that its slots are
reused; swap preemption too. A rank's disk share that is missing, torn or corrupt fails the load on
every rank: the blocks are recomputed, the same tokens come out."""
from __future__ import annotations

from pathlib import Path

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.config import EngineConfig
from baton.services.engine.kv.tiers.disk import HEADER
from baton.services.engine.kv.tiers.metrics import tier_metrics
from tests.engine.tiers_helpers import (GREEDY, conversations, engine, follow_ups, gib_for,
                                        two_turns)

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


def _disk_engine(tiny_model_dirs, host_gib: float, disk_dir: Path):
    """A host tier of 6 of a rank's blocks: most blocks go on to disk."""
    return engine(model=str(tiny_model_dirs["llama"]), tensor_parallel_size=2,
                  kv_offload_host_gib=host_gib * 6 / 48, kv_offload_disk_dir=str(disk_dir), **CPU)


def _files(disk_dir: Path, rank: int) -> dict[str, Path]:
    return {p.name: p for p in (disk_dir / "tp-2" / f"rank-{rank}").glob("*.kv")}


def test_tp2_disk_tier_outputs_equal_tp1_without_tiers(tiny_model_dirs, reference,
                                                       tmp_path: Path) -> None:
    """Then a second group on the same folder: rank 1's files that rank 0 no longer indexes are
    deleted, the others load back into an empty device cache and host tier."""
    outputs, host_gib = reference
    e = _disk_engine(tiny_model_dirs, host_gib, tmp_path)
    try:
        got, _ = two_turns(e, PROMPTS)
        assert e.tiers.flush()  # every rank's writes done
        assert got == outputs
        disk = e.tiers.stats["disk"]
        assert disk.hits > 0 and disk.blocks_loaded > 0 and disk.checksum_failures == 0
        loaded = {m.name: m for m in tier_metrics(e.tiers, "m")}["baton_kv_tier_loaded_bytes"]
        assert [s.value for s in loaded.samples if s.labels["tier"] == "disk"] == \
            [disk.bytes_loaded]
        # Each rank holds its share of the same blocks, the ones rank 0's index names.
        names = {f"{h:016x}.kv" for h in e.tiers.disk.index}
        assert len(names) > 0 and set(_files(tmp_path, 0)) == names == set(_files(tmp_path, 1))
    finally:
        e.close()
    _files(tmp_path, 0).popitem()[1].unlink()
    e = _disk_engine(tiny_model_dirs, host_gib, tmp_path)
    try:
        half = len(PROMPTS)
        again = e.generate(follow_ups(PROMPTS, outputs[:half]), GREEDY)
        assert [o.token_ids for o in again] == outputs[half:]
        assert e.tiers.stats["disk"].blocks_loaded > 0
        assert e.tiers.flush()
        assert set(_files(tmp_path, 1)) <= set(_files(tmp_path, 0))
    finally:
        e.close()


def _damage(paths: list[Path]) -> None:
    """Each file removed, torn or with a payload byte flipped, in turn."""
    for i, path in enumerate(paths):
        data = bytearray(path.read_bytes())
        if i % 3 == 0:
            path.unlink()
        elif i % 3 == 1:
            path.write_bytes(bytes(data[:HEADER.size + 7]))
        else:
            data[HEADER.size + 3] ^= 0xFF
            path.write_bytes(bytes(data))


def test_tp2_failed_rank1_disk_share_fails_the_load(tiny_model_dirs, reference,
                                                    tmp_path: Path) -> None:
    """Rank 1's files damaged after the first turns, rank 0's whole, and no more blocks written
    (as when a disk fills): no block loads from disk, the second turns recompute them with the
    same tokens, and each block refused is dropped on every rank and counted."""
    outputs, host_gib = reference
    e = _disk_engine(tiny_model_dirs, host_gib, tmp_path)
    try:
        first = e.generate(PROMPTS, GREEDY)
        assert e.tiers.flush()
        damaged = _files(tmp_path, 1)
        assert damaged and set(damaged) == set(_files(tmp_path, 0))
        _damage(list(damaged.values()))
        e.tiers.disk.writable = False  # so that every disk hit below is a damaged block
        # Swap preemption may have loaded blocks from disk already.
        loaded_before = e.tiers.stats["disk"].blocks_loaded
        second = e.generate(follow_ups(PROMPTS, [o.token_ids for o in first]), GREEDY)
        assert e.tiers.flush()
        assert [o.token_ids for o in first + second] == outputs
        disk = e.tiers.stats["disk"]
        assert disk.hits > 0 and disk.blocks_loaded == loaded_before
        dropped = {n for n in damaged if int(n.removesuffix(".kv"), 16) not in e.tiers.disk.index}
        assert 0 < disk.checksum_failures == len(dropped)
        assert not dropped & (set(_files(tmp_path, 0)) | set(_files(tmp_path, 1)))
    finally:
        e.close()


def test_disk_tier_at_tp2_is_accepted(tmp_path) -> None:
    config = EngineConfig(tensor_parallel_size=2, kv_offload_host_gib=1.0,
                          kv_offload_disk_dir=str(tmp_path))
    assert config.kv_offload_disk_dir == str(tmp_path)
