"""The KV transports between two processes' CUDA caches (NIXL over UCX's CUDA transports, and direct
CUDA IPC), checked byte for byte; skipped without a GPU. The CPU-side checks of the CUDA IPC
transport run everywhere."""
from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from dataclasses import replace
from typing import Iterator

import pytest
import torch

from baton.loadtest.bench.kv_loopback import CacheShape, SourceProcess, SourceSpec, blocks_digest
from baton.services.common.process import free_port
from baton.services.engine.kv.layout import KVLayout, byte_view
from baton.services.worker.kv_transfer import KVPeer, KVTransferError, KVTransport, make_transport
from baton.services.worker.kv_transfer.cuda_ipc import (CudaIpcKVTransport, _closed_by_peer,
                                                        _Handler, _Listener)

KINDS = ("nixl", "cuda_ipc")
# 64 KiB blocks
SHAPE = CacheShape(num_layers=4, num_blocks=40, block_size=16, kv_heads=8, head_dim=128)
LOCAL_BLOCKS = 32
TIMEOUT_S = 30.0


def test_cuda_ipc_refuses_a_host_cache() -> None:
    with pytest.raises(ValueError, match="needs a CUDA KV cache"):
        make_transport("cuda_ipc", torch.zeros(SHAPE.dims(), dtype=torch.bfloat16), "x",
                       "127.0.0.1", 0)


class _Inbox:
    """What the CUDA IPC listener needs of its transport: the cache and the notification inbox."""

    def __init__(self) -> None:
        self.cache = torch.zeros(SHAPE.dims(), dtype=torch.bfloat16)
        self.notes: list[bytes] = []

    def record_notification(self, msg: bytes) -> None:
        self.notes.append(msg)


def test_cuda_ipc_listener_protocol() -> None:
    """One JSON line per request and answer: notifications land in the inbox, bad requests get an
    error line, and a failed export (here: a host cache) is an error answer, not a dropped
    connection."""
    inbox = _Inbox()
    server = _Listener(("127.0.0.1", 0), _Handler)
    server.transport = inbox
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with socket.create_connection(server.server_address,
                                      timeout=5) as conn, conn.makefile("rb") as reader:
            def ask(line: bytes) -> dict:
                conn.sendall(line + b"\n")
                return json.loads(reader.readline())

            note = base64.b64encode(b"req-7").decode()
            assert ask(json.dumps({"op": "notify", "msg": note}).encode()) == {"ok": True}
            assert inbox.notes == [b"req-7"]
            assert "unknown op 'steal'" in ask(b'{"op": "steal"}')["error"]
            assert "bad request" in ask(b"not json")["error"]
            assert "exporting the cache failed" in ask(b'{"op": "handle"}')["error"]
            # still serving
            assert ask(json.dumps({"op": "notify", "msg": note}).encode()) == {"ok": True}
    finally:
        server.shutdown()
        server.server_close()


def test_a_socket_closed_by_the_peer_is_noticed_before_reuse() -> None:
    ours, theirs = socket.socketpair()
    with ours:
        assert not _closed_by_peer(ours)
        theirs.close()
        assert _closed_by_peer(ours)


def _client() -> CudaIpcKVTransport:
    """The decode side's connection logic without a GPU (the constructor needs a CUDA cache)."""
    client = CudaIpcKVTransport.__new__(CudaIpcKVTransport)
    client._remotes = {}
    return client


def _peer(port: int) -> KVPeer:
    return KVPeer(
        "src", "127.0.0.1", port,
        KVLayout(SHAPE.num_layers, SHAPE.num_blocks, SHAPE.block_size, SHAPE.block_nbytes(), 0,
                 "bfloat16"))


def test_cuda_ipc_connect_reports_an_unreachable_peer() -> None:
    with pytest.raises(KVTransferError, match="is unreachable") as info:
        _client()._connect(_peer(free_port()), 2.0)
    assert info.value.reason == "unreachable"


def test_cuda_ipc_connect_reports_a_refused_export_and_keeps_nothing() -> None:
    server = _Listener(("127.0.0.1", 0), _Handler)
    server.transport = _Inbox()  # a host cache: its export fails on the peer's side
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = _client()
    try:
        with pytest.raises(KVTransferError,
                           match="refused handle: exporting the cache failed") as info:
            client._connect(_peer(server.server_address[1]), 5.0)
        assert info.value.reason == "invalid" and client._remotes == {}
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def source() -> Iterator[SourceProcess]:
    spec = SourceSpec(SHAPE, 77, f"kv-gpu-src-{os.getpid()}", free_port(), free_port(), "cuda",
                      free_port(), KINDS)
    process = SourceProcess(spec).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def local_cache() -> torch.Tensor:
    return torch.zeros(
        (SHAPE.num_layers, LOCAL_BLOCKS, 2, SHAPE.block_size, SHAPE.kv_heads, SHAPE.head_dim),
        dtype=torch.bfloat16, device="cuda")


@pytest.fixture(scope="module")
def transports(local_cache: torch.Tensor) -> Iterator[dict[str, KVTransport]]:
    made = {
        kind: make_transport(kind, local_cache, f"kv-gpu-dst-{kind}-{os.getpid()}", "127.0.0.1",
                             free_port(), metrics=False)
        for kind in KINDS
    }
    yield made
    for transport in made.values():
        transport.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("remote_blocks, local_blocks", [
    # scattered: gather + scatter
    ([39, 2, 17, 0, 5, 31, 8, 22, 11, 3], [0, 30, 3, 4, 9, 12, 1, 2, 6, 7]),
    (list(range(4, 20)), list(range(10, 26))),  # one run
])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_read_is_byte_exact(kind: str, remote_blocks: list[int], local_blocks: list[int],
                                source: SourceProcess, transports: dict[str, KVTransport],
                                local_cache: torch.Tensor) -> None:
    local_cache.zero_()
    note = f"gpu-{kind}-{remote_blocks[0]}".encode()
    result = transports[kind].read(source.peers[kind], remote_blocks, local_blocks, note, TIMEOUT_S)
    torch.cuda.synchronize()
    assert result.num_bytes == len(remote_blocks) * SHAPE.num_layers * SHAPE.block_nbytes()
    assert blocks_digest(local_cache, local_blocks) == source.digest(remote_blocks)
    untouched = [b for b in range(LOCAL_BLOCKS) if b not in local_blocks]
    assert not byte_view(local_cache)[:, untouched].any()
    seen: set[bytes] = set()
    deadline = time.monotonic() + 5
    while note not in seen and time.monotonic() < deadline:
        seen.update(source.notifications()[kind])
        time.sleep(0.02)
    assert note in seen


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_ipc_reads_a_restarted_peer_afresh(transports: dict[str, KVTransport],
                                               local_cache: torch.Tensor) -> None:
    """A killed peer's mapping must not be reused: the read after its restart opens the new
    cache."""
    spec = SourceSpec(SHAPE, 78, f"kv-gpu-restart-{os.getpid()}", free_port(), free_port(), "cuda",
                      free_port(), ("cuda_ipc", ))
    victim = SourceProcess(spec).start()
    try:
        transports["cuda_ipc"].read(victim.peers["cuda_ipc"], [1, 2], [0, 1], b"", TIMEOUT_S)
        victim.kill()
        # other bytes: a read of the dead process's mapping cannot pass
        victim.spec = replace(spec, seed=79)
        victim.start()
        local_cache.zero_()
        transports["cuda_ipc"].read(victim.peers["cuda_ipc"], [5, 9], [3, 4], b"after-restart",
                                    TIMEOUT_S)
        assert blocks_digest(local_cache, [3, 4]) == victim.digest([5, 9])
    finally:
        victim.stop()
