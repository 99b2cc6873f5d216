"""An EAGLE head's cache moves with the KV cache over both transports between two real processes
(a spawned source, as in test_kv_transfer.py): one read, one notification; a reader without a head
cache, or with one of another shape, reads the target's blocks alone; a read by head slices (across
tensor-parallel sizes or orders) reads the head from prefill rank 0 before it notifies."""
from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Iterator

import pytest
import torch
from prometheus_client import CollectorRegistry

from baton.loadtest.bench.kv_loopback import (CacheShape, SourceProcess, SourceSpec,
                                              blocks_digest, empty_cache, heads_digest)
from baton.services.common.process import free_port
from baton.services.worker.kv_transfer import KVTransport, make_transport

KINDS = ("nixl", "grpc")
SOURCE = CacheShape(num_layers=3, num_blocks=10, block_size=4, kv_heads=2, head_dim=8)
LOCAL = CacheShape(num_layers=3, num_blocks=7, block_size=4, kv_heads=2, head_dim=8)
HEADS = {"same": CacheShape(1, 7, 4, 2, 8), "other": CacheShape(1, 7, 4, 1, 8), "none": None}
TIMEOUT_S = 5.0


@pytest.fixture(scope="module")
def source() -> Iterator[SourceProcess]:
    spec = SourceSpec(SOURCE, 99, f"kv-head-src-{os.getpid()}", free_port(), free_port(),
                      head=CacheShape(1, 10, 4, 2, 8))
    process = SourceProcess(spec).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def readers() -> Iterator[dict[tuple[str, str], tuple[KVTransport, torch.Tensor, torch.Tensor]]]:
    """Per (transport, head variant): the transport, its KV cache and its head cache (or None)."""
    made = {}
    for kind in KINDS:
        for variant, shape in HEADS.items():
            cache = torch.zeros(LOCAL.dims(), dtype=torch.bfloat16)
            head = None if shape is None else torch.zeros(shape.dims(), dtype=torch.bfloat16)
            transport = make_transport(kind, cache, f"kv-head-dst-{variant}-{os.getpid()}",
                                       "127.0.0.1", free_port() if kind == "nixl" else 0,
                                       registry=CollectorRegistry(), head_cache=head)
            made[kind, variant] = transport, cache, head
    yield made
    for transport, _, _ in made.values():
        transport.close()


def _notices(source: SourceProcess, kind: str, wanted: bytes) -> list[bytes]:
    """Every notification for `wanted` that arrives within a generous deadline."""
    seen: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and wanted not in seen:
        seen += source.notifications()[kind]
        time.sleep(0.02)
    time.sleep(0.2)
    return [n for n in seen + source.notifications()[kind] if n == wanted]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("remote_blocks, local_blocks", [([9, 2, 5, 0], [0, 6, 3, 4]),
                                                         ([2, 3, 4, 8], [1, 2, 3, 5])])
def test_head_blocks_move_with_the_kv_blocks(kind, remote_blocks, local_blocks, source, readers):
    transport, cache, head = readers[kind, "same"]
    head.zero_()
    note = f"head-{kind}-{remote_blocks[0]}".encode()
    result = transport.read(source.peers[kind], remote_blocks, local_blocks, note, TIMEOUT_S)
    assert blocks_digest(cache, local_blocks) == source.digest(remote_blocks)
    assert blocks_digest(head, local_blocks) == source.head_cache_digest(remote_blocks)
    untouched = [b for b in range(LOCAL.num_blocks) if b not in local_blocks]
    assert not head[:, untouched].any()
    assert result.num_bytes == len(remote_blocks) * 4 * SOURCE.block_nbytes()
    assert _notices(source, kind, note) == [note]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variant", ["other", "none"])
def test_a_reader_without_a_matching_head_reads_the_kv_alone(kind, variant, source, readers):
    transport, cache, head = readers[kind, variant]
    assert source.peers[kind].head_layout is not None
    note = f"alone-{kind}-{variant}".encode()
    result = transport.read(source.peers[kind], [1, 7], [5, 2], note, TIMEOUT_S)
    assert blocks_digest(cache, [5, 2]) == source.digest([1, 7])
    assert head is None or not head.any()
    assert result.num_bytes == 2 * SOURCE.num_layers * SOURCE.block_nbytes()
    assert _notices(source, kind, note) == [note]


def test_a_read_by_head_slices_reads_the_head_from_rank_0():
    """An HND source read into an NHD cache goes by head slices (head_transport.py's path for
    any TP pair); the heads' caches are both HND, so the head's blocks come whole."""
    hnd = CacheShape(1, 10, 4, 2, 8, order="HND")
    spec = SourceSpec(replace(SOURCE, order="HND"), 5, f"kv-head-hnd-{os.getpid()}", free_port(),
                      free_port(), transports=("nixl",), head=hnd)
    source = SourceProcess(spec).start()
    cache = torch.zeros(LOCAL.dims(), dtype=torch.bfloat16)
    head = empty_cache(replace(hnd, num_blocks=LOCAL.num_blocks)).zero_()
    transport = make_transport("nixl", cache, f"kv-head-hnd-dst-{os.getpid()}", "127.0.0.1",
                               free_port(), registry=CollectorRegistry(), heads=(4, 2),
                               head_cache=head)
    try:
        remote, local = [9, 2, 5, 0], [0, 6, 3, 4]
        transport.read(source.peers["nixl"], remote, local, b"sliced", TIMEOUT_S)
        assert heads_digest(cache, local, 0, 2) == source.heads_digest(remote, 0, 2)
        assert blocks_digest(head, local) == source.head_cache_digest(remote)
        assert _notices(source, "nixl", b"sliced") == [b"sliced"]
    finally:
        transport.close()
        source.stop()
