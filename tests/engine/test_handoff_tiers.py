"""A decode engine with KV tiers looks in them before it pulls: prompt blocks that other traffic
pushed from its device cache into its host tier (or on to disk) are loaded back into the
reservation, only the blocks after them are copied from the prefill engine, and the greedy tokens
equal one engine's alone."""
from __future__ import annotations

import random

import pytest

from baton.services.common.sampling_params import SamplingParams
from baton.services.engine.llm_engine import LLMEngine
from baton.services.engine.requests import EngineRequest
from tests.engine.tiers_helpers import GREEDY, conversations, engine, gib_for
from tests.launcher import wait_for

FIRST = conversations(1, seed=3)[0]
SECOND = FIRST + [random.Random(4).randrange(5, 250) for _ in range(14)]
OTHERS = conversations(8, seed=11)  # enough traffic to take every device block


@pytest.fixture(scope="module")
def expected() -> tuple[list[int], float]:
    """One engine's greedy tokens for SECOND, and a host setting of 400 blocks."""
    e = engine()
    return e.generate([SECOND], GREEDY)[0].token_ids, gib_for(e, 400)


def handoff_with_tiers(prefill: LLMEngine, decode: LLMEngine, rid: str,
                       prompt: list[int]) -> tuple[list[int], int, int]:
    """The tokens, the blocks that came from decode's own tiers, and the blocks copied over."""
    prefill.add_request(rid, prompt, SamplingParams(**{**vars(GREEDY), "max_tokens": 1}),
                        hold_kv=True)
    first = None
    while first is None:
        first = next((o for o in prefill.step() if o.request_id == rid and o.finished), None)
    src = prefill.held_kv(rid).block_ids
    dst, cached, loading = decode.reserve_prefilled(EngineRequest(rid, prompt, GREEDY))
    landed: list[int] = []
    wait_for(lambda: landed.append(decode.prefilled_loaded(rid)) or landed[-1] is not None,
             120, "the tier load")
    in_place = landed[-1]
    assert cached <= in_place <= cached + loading
    decode.kv_cache[:, dst[in_place:]] = prefill.kv_cache[:, src[in_place:]]
    assert prefill.release_kv(rid)
    out = decode.commit_prefilled(rid, first.token_ids[0])
    while not out.finished:
        out = next(o for o in decode.step() if o.request_id == rid)
    return out.token_ids, in_place - cached, len(dst) - in_place


@pytest.mark.parametrize("disk", [False, True], ids=["host", "disk"])
def test_decode_loads_its_tier_blocks_and_pulls_only_the_rest(expected, disk, tmp_path) -> None:
    tokens, host_gib = expected
    # With disk: a host tier of 4 blocks pushes the first turn's blocks on to disk.
    tiers = ({"kv_offload_host_gib": host_gib * 4 / 400, "kv_offload_disk_dir": str(tmp_path)}
             if disk else {"kv_offload_host_gib": host_gib})
    prefill, decode = engine(), engine(**tiers)
    try:
        decode.generate([FIRST], GREEDY)
        decode.generate(OTHERS, GREEDY)
        assert decode.tiers.flush()
        got, from_tiers, pulled = handoff_with_tiers(prefill, decode, "r", SECOND)
        assert got == tokens
        bs = decode.block_size
        assert from_tiers == len(FIRST) // bs  # every full block of the first turn's prompt
        assert pulled == -(-len(SECOND) // bs) - from_tiers
        stats = decode.tiers.stats["disk" if disk else "host"]
        assert stats.hits >= from_tiers * bs and stats.blocks_loaded >= from_tiers
        assert decode.blocks.num_free_blocks == decode.blocks.num_blocks
    finally:
        decode.close()


def test_released_reservation_waits_for_its_load(expected) -> None:
    """A reservation ended while its blocks load (the caller left) frees them only once the copy
    is done, and every block comes back."""
    decode = engine(kv_offload_host_gib=expected[1])
    try:
        decode.generate([FIRST], GREEDY)
        decode.generate(OTHERS, GREEDY)
        assert decode.tiers.flush()
        reservation = decode.reserve_prefilled(EngineRequest("gone", SECOND, GREEDY))
        assert reservation.cached == 0 and reservation.loading == len(FIRST) // decode.block_size
        assert decode.release_kv("gone")
        assert decode.blocks.num_free_blocks == decode.blocks.num_blocks
        assert not decode.tiers.host.pins  # the load's host slots are unpinned
    finally:
        decode.close()


def test_block_events_name_their_tier_and_replay_to_the_snapshot(expected, tmp_path) -> None:
    """With events on (a worker's router mirrors its cache), blocks entering and leaving the host
    and disk tiers are logged with their medium; replayed, they give the tiers' snapshot."""
    e = engine(kv_offload_host_gib=expected[1] * 4 / 400, kv_offload_disk_dir=str(tmp_path))
    try:
        e.record_block_events()
        e.generate(OTHERS, GREEDY)
        assert e.tiers.flush()
        held: dict[str, set[int]] = {"device": set(), "host": set(), "disk": set()}
        kinds = set()
        for kind, block_hash, medium in e.drain_block_events():
            (held[medium].add if kind == "stored" else held[medium].discard)(block_hash)
            kinds.add((kind, medium))
        assert {m: set(hashes) for m, hashes in e.cached_block_hashes().items()} == held
        assert 0 < len(held["host"]) <= 4 and held["disk"]
        assert ("removed", "host") in kinds  # pushed on to disk
    finally:
        e.close()
