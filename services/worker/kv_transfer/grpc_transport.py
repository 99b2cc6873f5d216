"""The gRPC transport: the fallback where NIXL is unavailable. The decode side streams the blocks
with Worker.PullKV; the prefill side's servicer answers with `stream_blocks` and reports completion
with `record_notification`.

Each chunk is one (layer, block) range: the server makes the one copy protobuf needs (tensor ->
bytes), the client copies the bytes straight into its cache, with no staging tensor in between. An
EAGLE head's cache (one layer, the same block ids) streams as one layer more after the target's,
when both workers have one of the same shape (base.heads_match).
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
                                                    NotificationInbox, TransferResult, check_read,
                                                    heads_match)
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
                 metrics: TransferMetrics | None = None,
                 head_cache: torch.Tensor | None = None) -> None:
        super().__init__()
        self._name, self._host, self._port, self._metrics = worker_name, host, port, metrics
        self._layout = KVLayout.of(kv_cache)
        self._head_layout = None if head_cache is None else KVLayout.of(head_cache)
        # Per layer, the head's last: [blocks, block_nbytes] bytes. On CPU, numpy views let both
        # directions copy without a temporary tensor.
        self._layers = [layer for cache in (kv_cache, head_cache) if cache is not None
                        for layer in _byte_layers(cache)]
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    def local_peer(self) -> KVPeer:
        return KVPeer(self._name, self._host, self._port, self._layout,
                      head_layout=self._head_layout)

    # Decode side.

    def _read(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
              notification: bytes, timeout_s: float) -> TransferResult:
        check_read(self._layout, peer, remote_blocks, local_blocks)
        start = time.perf_counter()
        request_id = notification.decode("utf-8", "replace")
        address = f"{peer.host}:{peer.port}"
        stub = worker_pb2_grpc.WorkerStub(self._channel(address))
        head = heads_match(self._head_layout, peer.head_layout)
        request = worker_pb2.PullKVRequest(request_id=request_id, block_ids=remote_blocks,
                                           with_head=head)
        layers = self._layout.num_layers + head
        call = stub.PullKV(request, timeout=timeout_s)
        try:
            received = self._receive(call, peer, remote_blocks, local_blocks, layers)
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
        expected = layers * len(remote_blocks)
        if received != expected:
            self._drop_channel(address)
            raise KVTransferError(
                f"PullKV from {peer.name} ({address}) ended after {received} of {expected} "
                f"chunks", "failed")
        head_bytes = self._head_layout.block_nbytes * len(remote_blocks) if head else 0
        return TransferResult(len(remote_blocks) * self._layout.num_layers
                              * self._layout.block_nbytes + head_bytes,
                              time.perf_counter() - start)

    def _receive(self, chunks: Iterator[worker_pb2.KVChunk], peer: KVPeer, remote_blocks: list[int],
                 local_blocks: list[int], layers: int) -> int:
        """Copies the layer-major chunk stream into place, checking each is the one expected
        there."""
        n, received = len(remote_blocks), 0
        for chunk in chunks:
            layer, index = divmod(received, n) if n else (0, 0)
            size = self._layers[min(layer, len(self._layers) - 1)].shape[1]
            if (n == 0 or layer >= layers or chunk.layer != layer or
                    chunk.block_id != remote_blocks[index] or len(chunk.data) != size):
                raise KVTransferError(
                    f"PullKV from {peer.name} sent chunk {received} as (layer {chunk.layer}, block "
                    f"{chunk.block_id}, "
                    f"{len(chunk.data)} bytes); expected (layer {layer}, block "
                    f"{remote_blocks[index] if n else None}, {size} bytes)",
                    "failed")
            self._store(layer, local_blocks[index], chunk.data)
            received += 1
        return received

    def _store(self, layer: int, block: int, data: bytes) -> None:
        source = np.frombuffer(data, dtype=np.uint8)
        target = self._layers[layer]
        if isinstance(target, np.ndarray):
            target[block] = source
        else:
            target[block].copy_(torch.from_numpy(source.copy()))

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

    def stream_blocks(self, block_ids: list[int],
                      with_head: bool = False) -> Iterator[worker_pb2.KVChunk]:
        """Every layer of `block_ids`, layer-major, and with_head the head's after them. Raises
        KVTransferError ("invalid") at once for an unknown block id or a head this worker lacks,
        before the stream starts, so the servicer can answer INVALID_ARGUMENT."""
        bad = [b for b in block_ids if not 0 <= b < self._layout.num_blocks]
        if bad:
            raise KVTransferError(
                f"invalid block id {bad[0]}: the cache has blocks 0..{self._layout.num_blocks - 1}",
                "invalid")
        if with_head and self._head_layout is None:
            raise KVTransferError("the EAGLE head's blocks were asked for; this worker has no "
                                  "head", "invalid")
        return self._chunks(list(block_ids), self._layout.num_layers + with_head)

    def _chunks(self, block_ids: list[int], layers: int) -> Iterator[worker_pb2.KVChunk]:
        for layer in range(layers):
            for block in block_ids:
                yield worker_pb2.KVChunk(layer=layer, block_id=block,
                                         data=self._block_bytes(layer, block))

    def _block_bytes(self, layer: int, block: int) -> bytes:
        source = self._layers[layer][block]
        if isinstance(source, np.ndarray):
            return source.tobytes()
        return source.cpu().numpy().tobytes()

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()


def _byte_layers(cache: torch.Tensor) -> list[np.ndarray | torch.Tensor]:
    """Each layer of a cache as [blocks, block_nbytes] bytes: numpy views on CPU."""
    layers = byte_view(cache)
    return [layer.numpy() if cache.device.type == "cpu" else layer for layer in layers]
