"""A stand-in prefill worker in a child process, for the transport tests and `baton bench kv-transfer`.

The child owns a KV cache of seeded random bytes and serves it over both transports: its NIXL agent, and a gRPC
server with only PullKV. The parent drives it over a pipe (notifications, digests, stop) and can kill it outright.
"""
from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import signal
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Iterator

import grpc
import torch

from baton.services.worker.kv_transfer.base import KVPeer, KVTransferError
from baton.services.worker.kv_transfer.grpc_transport import CHANNEL_OPTIONS, GrpcKVTransport, byte_view
from baton.services.worker.kv_transfer.nixl_transport import NixlKVTransport
from baton.v1 import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0  # a cold child imports torch and starts UCX; on 2 busy cores that can take a while


@dataclass(frozen=True)
class CacheShape:
    num_layers: int
    num_blocks: int
    block_size: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"

    def dims(self) -> tuple[int, ...]:
        return self.num_layers, self.num_blocks, 2, self.block_size, self.kv_heads, self.head_dim

    def block_nbytes(self) -> int:
        return 2 * self.block_size * self.kv_heads * self.head_dim * getattr(torch, self.dtype).itemsize


def random_cache(shape: CacheShape, seed: int) -> torch.Tensor:
    """A cache whose every byte is drawn from `seed`, so the parent can rebuild the expected contents."""
    cache = torch.empty(shape.dims(), dtype=getattr(torch, shape.dtype))
    raw = byte_view(cache).view(-1)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)))
    return cache


def blocks_digest(cache: torch.Tensor, blocks: list[int]) -> str:
    """A hash of every layer of `blocks`, layer-major, read in place."""
    data, digest = byte_view(cache).numpy(), hashlib.blake2b(digest_size=16)
    for layer in range(data.shape[0]):
        for block in blocks:
            digest.update(data[layer, block])
    return digest.hexdigest()


class PullKVServicer(worker_pb2_grpc.WorkerServicer):
    """Only PullKV, as the worker's servicer implements it: stream, then record the notification."""

    def __init__(self, transport: GrpcKVTransport) -> None:
        self._transport = transport

    def PullKV(self, request: worker_pb2.PullKVRequest, context: grpc.ServicerContext) -> Iterator[worker_pb2.KVChunk]:
        try:
            chunks = self._transport.stream_blocks(list(request.block_ids))
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


def _source_main(spec: SourceSpec, conn: Any) -> None:
    cache = random_cache(spec.shape, spec.seed)
    nixl = NixlKVTransport(cache, spec.agent_name, "127.0.0.1", spec.nixl_port)
    grpc_transport = GrpcKVTransport(cache, spec.agent_name, "127.0.0.1", spec.grpc_port)
    server = serve_pull_kv(grpc_transport, spec.grpc_port)
    conn.send({"nixl": nixl.local_peer(), "grpc": grpc_transport.local_peer()})
    transports = {"nixl": nixl, "grpc": grpc_transport}
    while True:
        command, arg = conn.recv()
        if command == "notifications":
            conn.send({kind: t.take_notifications() for kind, t in transports.items()})
        elif command == "digest":
            conn.send(blocks_digest(cache, arg))
        elif command == "stop":
            break
    server.stop(grace=None)
    nixl.close()
    grpc_transport.close()
    conn.send("stopped")


class SourceProcess:
    """The parent's handle on a source child; `start` again after `kill` restarts it on the same name and ports."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self._context = multiprocessing.get_context("spawn")  # a forked child would inherit UCX and gRPC threads
        self._process: Any = None
        self._conn: Any = None
        self.peers: dict[str, KVPeer] = {}

    def start(self) -> "SourceProcess":
        parent, child = self._context.Pipe()
        self._process = self._context.Process(target=_source_main, args=(self.spec, child), daemon=True,
                                              name=f"kv-source-{self.spec.agent_name}")
        self._process.start()
        child.close()
        self._conn = parent
        if not parent.poll(START_TIMEOUT_S):
            self.kill()
            raise RuntimeError(f"KV source {self.spec.agent_name} did not start in {START_TIMEOUT_S:.0f} s")
        self.peers = parent.recv()
        return self

    def _ask(self, command: str, arg: Any = None) -> Any:
        self._conn.send((command, arg))
        return self._conn.recv()

    def notifications(self) -> dict[str, list[bytes]]:
        return self._ask("notifications")

    def digest(self, blocks: list[int]) -> str:
        return self._ask("digest", blocks)

    def pause(self) -> None:
        """SIGSTOP: alive and connected but answering nothing, as a wedged worker."""
        os.kill(self._process.pid, signal.SIGSTOP)

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
