from __future__ import annotations

from baton.services.common.block_hash import block_hashes, root_hash
from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.kv.block_manager import BlockManager
from baton.services.engine.sequence import Sequence

BS = 4


def seq(tokens: list[int], rid: str = "r", salt: str | None = None) -> Sequence:
    return Sequence(rid, tokens, SamplingParams(), cache_salt=salt)


def run_prefill(bm: BlockManager, s: Sequence) -> list[int]:
    """Admits s with its cache hits and pretends the model computed the rest; returns the hits."""
    hits = bm.cached_prefix(s)
    assert bm.can_admit(hits, s.num_tokens)
    bm.admit(s, hits)
    bm.grow(s, s.num_tokens)
    old = s.num_computed_tokens
    s.num_computed_tokens = s.num_tokens
    bm.cache_full_blocks(s, old)
    return hits


def test_hash_is_stable_across_processes_and_versions():
    # A golden value: every worker and the router must agree on it, now and after upgrades.
    assert root_hash("m") == 0x8BAE64D999160205
    assert block_hashes([1, 2, 3, 4, 5], 4, "m") == [10466089655513631971]


def test_hash_chain_covers_model_and_salt():
    tokens = list(range(12))
    plain = block_hashes(tokens, BS, "model-a")
    assert len(plain) == 3 and len(set(plain)) == 3
    assert block_hashes(tokens, BS, "model-b") != plain
    salted = block_hashes(tokens, BS, "model-a", cache_salt="tenant-1")
    assert all(a != b for a, b in zip(salted, plain))
    # Same block contents at a different place in the chain hash differently.
    assert block_hashes([0, 1, 2, 3] * 2, BS, "model-a")[1] != plain[0]


def test_prefix_hit_pins_shared_blocks_and_never_the_last_token():
    bm = BlockManager(16, BS, "m")
    a = seq(list(range(10)), "a")
    assert run_prefill(bm, a) == []
    b = seq(list(range(8)) + [99, 98, 97], "b")
    hits = run_prefill(bm, b)
    assert hits == a.block_ids[:2]
    assert all(bm.ref_counts[blk] == 2 for blk in hits)
    # A prompt made only of cached full blocks still computes its last block.
    c = seq(list(range(8)), "c")
    assert run_prefill(bm, c) == a.block_ids[:1]


def test_salt_isolates_tenants():
    bm = BlockManager(16, BS, "m")
    run_prefill(bm, seq(list(range(12)), "a", salt="t1"))
    assert bm.cached_prefix(seq(list(range(12)) + [1], "b", salt="t2")) == []
    assert len(bm.cached_prefix(seq(list(range(12)) + [1], "c", salt="t1"))) == 3


def test_freed_cached_blocks_stay_hittable_until_evicted_lru():
    bm = BlockManager(6, BS, "m")
    a = seq(list(range(9)), "a")  # 3 blocks, 2 full and cached
    run_prefill(bm, a)
    a_blocks = list(a.block_ids)
    bm.free(a)
    assert bm.num_free_blocks == 6
    again = seq(list(range(9)), "a2")
    assert bm.cached_prefix(again) == a_blocks[:2]
    # Filling the cache with other work evicts the cached blocks last, tail before head.
    other = seq(list(range(100, 116)), "o")  # needs 4 blocks: the 4 unhashed ones go first
    run_prefill(bm, other)
    assert len(bm.cached_prefix(seq(list(range(9)), "a3"))) == 2
    bm.grow(other, 20)  # one more block: evicts the tail of a's chain
    assert len(bm.cached_prefix(seq(list(range(9)), "a4"))) == 1


def test_ref_counts_return_to_zero():
    bm = BlockManager(8, BS, "m")
    seqs = [seq(list(range(10)), f"s{i}") for i in range(3)]
    for s in seqs:
        run_prefill(bm, s)
    for s in seqs:
        bm.free(s)
    assert bm.ref_counts == [0] * 8
    assert bm.num_free_blocks == 8
