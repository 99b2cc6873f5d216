"""A stand-in prefill worker in a child process, for the transport tests and `baton bench
kv-transfer`.

The child owns a KV cache of seeded random bytes (on the CPU or a GPU) and serves it over every
transport it can: its NIXL agent, a gRPC server with only PullKV, and on a GPU the CUDA IPC
listener. The parent drives it over a pipe (notifications, digests, stop) and can kill it outright.
"""
from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import signal
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Iterator

import grpc
import torch

from baton.services.engine.kv.layout import byte_view
from baton.services.worker.kv_transfer.base import KVPeer, KVTransferError
from baton.services.worker.kv_transfer.grpc_transport import CHANNEL_OPTIONS, GrpcKVTransport
from baton.v1 import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)

# a cold child imports torch and starts UCX; on 2 busy cores that can take a while
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CacheShape:
    num_layers: int
    num_blocks: int
    block_size: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    order: str = "NHD"  # the cache's in-block order (engine/kv/layout.py)

    def dims(self) -> tuple[int, ...]:
        return self.num_layers, self.num_blocks, 2, self.block_size, self.kv_heads, self.head_dim

    def block_nbytes(self) -> int:
        return 2 * self.block_size * self.kv_heads * self.head_dim * getattr(torch,
                                                                             self.dtype).itemsize


def empty_cache(shape: CacheShape, device: str = "cpu") -> torch.Tensor:
    """Uninitialised, of logical shape `dims()`, stored in `shape.order`."""
    dtype = getattr(torch, shape.dtype)
    if shape.order == "HND":
        layers, blocks, kv, size, heads, dim = shape.dims()
        return torch.empty((layers, blocks, kv, heads, size, dim), dtype=dtype,
                           device=device).transpose(3, 4)
    return torch.empty(shape.dims(), dtype=dtype, device=device)


def random_cache(shape: CacheShape, seed: int, device: str = "cpu") -> torch.Tensor:
    """A cache whose every byte is drawn from `seed` on `device`, so the parent can rebuild the
    expected contents (the same seed gives different bytes on the CPU and on a GPU)."""
    cache = empty_cache(shape, device)
    raw = byte_view(cache).view(-1)
    generator = torch.Generator(device=device).manual_seed(seed)
    raw.copy_(
        torch.randint(0, 256, raw.shape, dtype=torch.uint8, device=device, generator=generator))
    return cache


def blocks_digest(cache: torch.Tensor, blocks: list[int]) -> str:
    """A hash of every layer of `blocks`, layer-major (a GPU cache's blocks are gathered to the host
    first)."""
    if cache.device.type != "cpu":
        data = byte_view(cache)[:, list(blocks)].cpu().numpy()
        blocks = list(range(len(blocks)))
    else:
        data = byte_view(cache).numpy()
    digest = hashlib.blake2b(digest_size=16)
    for layer in range(data.shape[0]):
        for block in blocks:
            digest.update(data[layer, block])
    return digest.hexdigest()


def heads_digest(cache: torch.Tensor, blocks: list[int], start: int, count: int) -> str:
    """A hash of KV heads [start, start + count) of every layer of `blocks`, in logical order, so
    caches of either order compare."""
    values = cache[:, list(blocks), :, :, start:start + count].contiguous().cpu()
    return hashlib.blake2b(values.view(torch.uint8).numpy().tobytes(), digest_size=16).hexdigest()


class PullKVServicer(worker_pb2_grpc.WorkerServicer):
    """Only PullKV, as the worker's servicer implements it: stream, then record the notification."""

    def __init__(self, transport: GrpcKVTransport) -> None:
        self._transport = transport

    def PullKV(self, request: worker_pb2.PullKVRequest,
               context: grpc.ServicerContext) -> Iterator[worker_pb2.KVChunk]:
        try:
            chunks = self._transport.stream_blocks(list(request.block_ids), request.with_head)
        except KVTransferError as e:
            log.warning("PullKV for request %s refused: %s", request.request_id, e)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request {request.request_id}: {e}")
        yield from chunks
        self._transport.record_notification(request.request_id.encode())


def serve_pull_kv(transport: GrpcKVTransport, port: int) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=CHANNEL_OPTIONS)
    worker_pb2_grpc.add_WorkerServicer_to_server(PullKVServicer(transport), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


@dataclass(frozen=True)
class SourceSpec:
    shape: CacheShape
    seed: int
    agent_name: str
    nixl_port: int
    grpc_port: int
    device: str = "cpu"
    ipc_port: int = 0  # the CUDA IPC listener's (GPU caches only; 0: any free port)
    transports: tuple[str, ...] = ("nixl", "grpc")  # what to serve; cuda_ipc needs a GPU cache
    head: CacheShape | None = None  # an EAGLE head's one-layer cache beside it (seed + 1)


def _source_transports(spec: SourceSpec, cache: torch.Tensor,
                       head: torch.Tensor | None) -> dict[str, Any]:
    transports: dict[str, Any] = {}
    if "nixl" in spec.transports:
        from baton.services.worker.kv_transfer.nixl_transport import NixlKVTransport
        transports["nixl"] = NixlKVTransport(cache, spec.agent_name, "127.0.0.1", spec.nixl_port,
                                             head_cache=head)
    if "grpc" in spec.transports:
        transports["grpc"] = GrpcKVTransport(cache, spec.agent_name, "127.0.0.1", spec.grpc_port,
                                             head_cache=head)
    if "cuda_ipc" in spec.transports:
        from baton.services.worker.kv_transfer.cuda_ipc import CudaIpcKVTransport
        transports["cuda_ipc"] = CudaIpcKVTransport(cache, spec.agent_name, "127.0.0.1",
                                                    spec.ipc_port)
    return transports


def _source_main(spec: SourceSpec, conn: Any) -> None:
    cache = random_cache(spec.shape, spec.seed, spec.device)
    if cache.is_cuda:
        torch.cuda.synchronize()
    head = None if spec.head is None else random_cache(spec.head, spec.seed + 1, spec.device)
    transports = _source_transports(spec, cache, head)
    server = serve_pull_kv(transports["grpc"], spec.grpc_port) if "grpc" in transports else None
    conn.send({kind: t.local_peer() for kind, t in transports.items()})
    while True:
        command, arg = conn.recv()
        if command == "notifications":
            conn.send({kind: t.take_notifications() for kind, t in transports.items()})
        elif command == "digest":
            conn.send(blocks_digest(cache, arg))
        elif command == "heads_digest":
            conn.send(heads_digest(cache, *arg))
        elif command == "head_cache_digest":
            conn.send(blocks_digest(head, arg))
        elif command == "stop":
            break
    if server is not None:
        server.stop(grace=None)
    for transport in transports.values():
        transport.close()
    conn.send("stopped")


PAUSE_TIMEOUT_S = 5.0


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of pid in state T (stopped), from /proc/PID/task/*/stat: the state follows
    the parenthesised command name."""
    tasks = f"/proc/{pid}/task"
    for tid in os.listdir(tasks):
        try:
            with open(f"{tasks}/{tid}/stat") as f:
                state = f.read().rpartition(")")[2].split()[0]
        except FileNotFoundError:  # a thread that ended meanwhile runs nothing
            continue
        if state not in ("T", "t"):
            return False
    return True


class SourceProcess:
    """The parent's handle on a source child; `start` again after `kill` restarts it on the same
    name and ports."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        # a forked child would inherit UCX and gRPC threads
        self._context = multiprocessing.get_context("spawn")
        self._process: Any = None
        self._conn: Any = None
        self.peers: dict[str, KVPeer] = {}

    def start(self) -> "SourceProcess":
        parent, child = self._context.Pipe()
        self._process = self._context.Process(target=_source_main, args=(self.spec, child),
                                              daemon=True, name=f"kv-source-{self.spec.agent_name}")
        self._process.start()
        child.close()
        self._conn = parent
        if not parent.poll(START_TIMEOUT_S):
            self.kill()
            raise RuntimeError(
                f"KV source {self.spec.agent_name} did not start in {START_TIMEOUT_S:.0f} s")
        self.peers = parent.recv()
        return self

    def _ask(self, command: str, arg: Any = None) -> Any:
        self._conn.send((command, arg))
        return self._conn.recv()

    def notifications(self) -> dict[str, list[bytes]]:
        return self._ask("notifications")

    def digest(self, blocks: list[int]) -> str:
        return self._ask("digest", blocks)

    def heads_digest(self, blocks: list[int], start: int, count: int) -> str:
        return self._ask("heads_digest", (blocks, start, count))

    def head_cache_digest(self, blocks: list[int]) -> str:
        """blocks_digest of the EAGLE head's cache (spec.head)."""
        return self._ask("head_cache_digest", blocks)

    def pause(self) -> None:
        """SIGSTOP: alive and connected but answering nothing, as a wedged worker. Returns once
        every thread has stopped: delivery is asynchronous, and on a busy machine a thread still
        running could answer a request sent right after the signal."""
        os.kill(self._process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + PAUSE_TIMEOUT_S
        while not _all_threads_stopped(self._process.pid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"process {self._process.pid} did not stop")
            time.sleep(0.001)

    def resume(self) -> None:
        os.kill(self._process.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: no goodbye to its peers, as when a pod is evicted."""
        self._process.kill()
        self._process.join()
        self._conn.close()

    def stop(self) -> None:
        if self._process.is_alive():
            self._ask("stop")
            self._process.join(timeout=10)
        if self._process.is_alive():
            self.kill()
        self._conn.close()
