"""The KV transports between two processes' CUDA caches (NIXL over UCX's CUDA transports, and direct CUDA IPC),
checked byte for byte; skipped without a GPU. The CPU-side checks of the CUDA IPC transport run everywhere."""
from __future__ import annotations

import os
import time
from typing import Iterator

import pytest
import torch

from baton.services.common.process import free_port
from baton.services.worker.kv_transfer import KVTransport, make_transport
from baton.services.worker.kv_transfer.grpc_transport import byte_view
from baton.services.worker.kv_transfer.loopback import CacheShape, SourceProcess, SourceSpec, blocks_digest

KINDS = ("nixl", "cuda_ipc")
SHAPE = CacheShape(num_layers=4, num_blocks=40, block_size=16, kv_heads=8, head_dim=128)  # 64 KiB blocks
LOCAL_BLOCKS = 32
TIMEOUT_S = 30.0


def test_cuda_ipc_refuses_a_host_cache() -> None:
    with pytest.raises(ValueError, match="needs a CUDA KV cache"):
        make_transport("cuda_ipc", torch.zeros(SHAPE.dims(), dtype=torch.bfloat16), "x", "127.0.0.1", 0)


@pytest.fixture(scope="module")
def source() -> Iterator[SourceProcess]:
    spec = SourceSpec(SHAPE, 77, f"kv-gpu-src-{os.getpid()}", free_port(), free_port(), "cuda", free_port(), KINDS)
    process = SourceProcess(spec).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def local_cache() -> torch.Tensor:
    return torch.zeros((SHAPE.num_layers, LOCAL_BLOCKS, 2, SHAPE.block_size, SHAPE.kv_heads, SHAPE.head_dim),
                       dtype=torch.bfloat16, device="cuda")


@pytest.fixture(scope="module")
def transports(local_cache: torch.Tensor) -> Iterator[dict[str, KVTransport]]:
    made = {kind: make_transport(kind, local_cache, f"kv-gpu-dst-{kind}-{os.getpid()}", "127.0.0.1", free_port(),
                                 metrics=False) for kind in KINDS}
    yield made
    for transport in made.values():
        transport.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("remote_blocks, local_blocks", [
    ([39, 2, 17, 0, 5, 31, 8, 22, 11, 3], [0, 30, 3, 4, 9, 12, 1, 2, 6, 7]),  # scattered: gather + scatter
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
