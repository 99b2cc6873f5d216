"""The gRPC transport: the fallback where NIXL is unavailable. The decode side streams the blocks
with Worker.PullKV; the prefill side's servicer answers with `stream_blocks` and reports completion
with `record_notification`.

Each chunk is one (layer, block) range: the server makes the one copy protobuf needs (tensor ->
bytes), the client copies the bytes straight into its cache, with no staging tensor in between.
"""
from __future__ import annotations

import threading
import time
from typing import Iterator

import grpc
import numpy as np
import torch

from baton.services.engine.kv.layout import KVLayout, byte_view
from baton.services.worker.kv_transfer.base import (KVPeer, KVStreamSource, KVTransferError,
                                                    NotificationInbox, TransferResult, check_read)
from baton.services.worker.kv_transfer.telemetry import ObservedTransport, TransferMetrics
from baton.v1 import worker_pb2, worker_pb2_grpc

# Chunks are small, but a larger block shape must never trip gRPC's 4 MiB default.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]

_REASONS = {
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout", grpc.StatusCode.UNAVAILABLE: "unreachable",
    grpc.StatusCode.INVALID_ARGUMENT: "invalid", grpc.StatusCode.NOT_FOUND: "invalid",
    grpc.StatusCode.FAILED_PRECONDITION: "invalid", grpc.StatusCode.OUT_OF_RANGE: "invalid"
}


class GrpcKVTransport(NotificationInbox, ObservedTransport, KVStreamSource):
    name = "grpc"

    def __init__(self, kv_cache: torch.Tensor, worker_name: str, host: str, port: int,
                 metrics: TransferMetrics | None = None) -> None:
        super().__init__()
        self._name, self._host, self._port, self._metrics = worker_name, host, port, metrics
        self._layout = KVLayout.of(kv_cache)
        self._bytes = byte_view(kv_cache)
        # On CPU, numpy views let both directions copy without a temporary tensor.
        self._numpy = self._bytes.numpy() if kv_cache.device.type == "cpu" else None
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def local_peer(self) -> KVPeer:
        return KVPeer(self._name, self._host, self._port, self._layout)

    # Decode side.

    def _read(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
              notification: bytes, timeout_s: float) -> TransferResult:
        check_read(self._layout, peer, remote_blocks, local_blocks)
        start = time.perf_counter()
        request_id = notification.decode("utf-8", "replace")
        address = f"{peer.host}:{peer.port}"
        stub = worker_pb2_grpc.WorkerStub(self._channel(address))
        request = worker_pb2.PullKVRequest(request_id=request_id, block_ids=remote_blocks)
        call = stub.PullKV(request, timeout=timeout_s)
        try:
            received = self._receive(call, peer, remote_blocks, local_blocks)
        except KVTransferError:
            call.cancel()
            self._drop_channel(address)
            raise
        except grpc.RpcError as e:
            self._drop_channel(address)
            reason = _REASONS.get(e.code(), "failed")
            raise KVTransferError(
                f"PullKV from {peer.name} ({address}) failed: {e.code().name}: {e.details()}",
                reason) from e
        expected = self._layout.num_layers * len(remote_blocks)
        if received != expected:
            self._drop_channel(address)
            raise KVTransferError(
                f"PullKV from {peer.name} ({address}) ended after {received} of {expected} "
                f"chunks", "failed")
        return TransferResult(received * self._layout.block_nbytes, time.perf_counter() - start)

    def _receive(self, chunks: Iterator[worker_pb2.KVChunk], peer: KVPeer, remote_blocks: list[int],
                 local_blocks: list[int]) -> int:
        """Copies the layer-major chunk stream into place, checking each is the one expected
        there."""
        n, received = len(remote_blocks), 0
        for chunk in chunks:
            layer, index = divmod(received, n) if n else (0, 0)
            if (n == 0 or layer >= self._layout.num_layers or chunk.layer != layer or
                    chunk.block_id != remote_blocks[index] or
                    len(chunk.data) != self._layout.block_nbytes):
                raise KVTransferError(
                    f"PullKV from {peer.name} sent chunk {received} as (layer {chunk.layer}, block "
                    f"{chunk.block_id}, "
                    f"{len(chunk.data)} bytes); expected (layer {layer}, block "
                    f"{remote_blocks[index] if n else None}, {self._layout.block_nbytes} bytes)",
                    "failed")
            self._store(layer, local_blocks[index], chunk.data)
            received += 1
        return received

    def _store(self, layer: int, block: int, data: bytes) -> None:
        source = np.frombuffer(data, dtype=np.uint8)
        if self._numpy is not None:
            self._numpy[layer, block] = source
        else:
            self._bytes[layer, block].copy_(torch.from_numpy(source.copy()))

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            if address not in self._channels:
                self._channels[address] = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
            return self._channels[address]

    def _drop_channel(self, address: str) -> None:
        """A fresh channel reconnects at once; a failed one would wait out its reconnect backoff
        first."""
        with self._lock:
            channel = self._channels.pop(address, None)
        if channel is not None:
            channel.close()

    # Prefill side: helpers for the worker's PullKV servicer.

    def stream_blocks(self, block_ids: list[int]) -> Iterator[worker_pb2.KVChunk]:
        """Every layer of `block_ids`, layer-major. Raises KVTransferError ("invalid") at once for
        an unknown block id, before the stream starts, so the servicer can answer
        INVALID_ARGUMENT."""
        bad = [b for b in block_ids if not 0 <= b < self._layout.num_blocks]
        if bad:
            raise KVTransferError(
                f"invalid block id {bad[0]}: the cache has blocks 0..{self._layout.num_blocks - 1}",
                "invalid")
        return self._chunks(list(block_ids))

    def _chunks(self, block_ids: list[int]) -> Iterator[worker_pb2.KVChunk]:
        for layer in range(self._layout.num_layers):
            for block in block_ids:
                yield worker_pb2.KVChunk(layer=layer, block_id=block,
                                         data=self._block_bytes(layer, block))

    def _block_bytes(self, layer: int, block: int) -> bytes:
        if self._numpy is not None:
            return self._numpy[layer, block].tobytes()
        return self._bytes[layer, block].cpu().numpy().tobytes()

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
