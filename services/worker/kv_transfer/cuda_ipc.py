"""The CUDA IPC transport: same-node GPU to GPU without UCX, for when UCX's cuda_ipc cannot be had.

The prefill side exports its cache as a CUDA IPC handle (torch's `_share_cuda_`, i.e.
cudaIpcGetMemHandle on the allocation that holds it) and serves it, with a notification inbox, on a
small TCP listener (one JSON line per request and per answer). The decode side opens the handle once
per peer (cudaIpcOpenMemHandle) and then a read is device copies between the two caches on a side
stream: one slice copy per run of consecutive blocks, or for scattered blocks a gather + scatter in
chunks (the same kernels an in-process copy uses, ~200 GB/s on an H100). The copy is synchronised
before the read returns and before the peer is notified, so the peer never frees blocks still being
read.

Limits: both processes must be on one node and see the GPU under the same device index (for
Kubernetes: one pod, or pods sharing the host IPC namespace). The prefill side must have finished
writing the blocks it hands out; the engine's step ends with a host sync (sampling), so a KV handle
is only ever issued after its writes completed.
"""
from __future__ import annotations

import base64
import json
import logging
import select
import socket
import socketserver
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from baton.services.engine.kv.block_copy import copy_blocks
from baton.services.engine.kv.layout import KVLayout, byte_view, storage
from baton.services.worker.kv_transfer.base import (KVPeer, KVTransferError, NotificationInbox,
                                                    TransferResult, check_read)
from baton.services.worker.kv_transfer.telemetry import ObservedTransport, TransferMetrics

log = logging.getLogger(__name__)

_BYTES_FIELDS = ("handle", "ref_counter_handle", "event_handle")


def export_handle(kv_cache: torch.Tensor) -> dict[str, Any]:
    """The cache's CUDA IPC handle as JSON-able fields (bytes as base64)."""
    flat = storage(kv_cache).view(torch.uint8).view(-1)
    (device, handle, size_bytes, offset_bytes, ref_counter_handle, ref_counter_offset, event_handle,
     event_sync_required) = flat.untyped_storage()._share_cuda_()
    fields = dict(device=device, handle=handle, storage_size_bytes=size_bytes,
                  storage_offset_bytes=offset_bytes, ref_counter_handle=ref_counter_handle,
                  ref_counter_offset=ref_counter_offset, event_handle=event_handle,
                  event_sync_required=event_sync_required, tensor_offset=flat.storage_offset(),
                  numel=flat.numel())
    for key in _BYTES_FIELDS:
        fields[key] = None if fields[key] is None else base64.b64encode(fields[key]).decode("ascii")
    return fields


def open_handle(fields: dict[str, Any]) -> torch.Tensor:
    """The peer's cache as a flat uint8 tensor in this process (cudaIpcOpenMemHandle through
    torch)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    raw = {
        key: None if fields[key] is None else base64.b64decode(fields[key])
        for key in _BYTES_FIELDS
    }
    return rebuild_cuda_tensor(torch.Tensor, (fields["numel"], ), (1, ), fields["tensor_offset"],
                               torch.storage.TypedStorage, torch.uint8, fields["device"],
                               raw["handle"], fields["storage_size_bytes"],
                               fields["storage_offset_bytes"], False, raw["ref_counter_handle"],
                               fields["ref_counter_offset"], raw["event_handle"],
                               fields["event_sync_required"])


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        transport: CudaIpcKVTransport = self.server.transport  # type: ignore[attr-defined]
        for line in self.rfile:
            try:
                request = json.loads(line)
                if request.get("op") == "handle":
                    # Exported per asking peer: each opening consumes one count of the handle's IPC
                    # ref counter.
                    answer: dict[str, Any] = {"handle": export_handle(transport.cache)}
                elif request.get("op") == "notify":
                    transport.record_notification(base64.b64decode(request["msg"]))
                    answer = {"ok": True}
                else:
                    answer = {"error": f"unknown op {request.get('op')!r}"}
            except (ValueError, KeyError, TypeError) as e:
                answer = {"error": f"bad request: {e}"}
            except RuntimeError as e:  # torch's CUDA errors while exporting
                answer = {"error": f"exporting the cache failed: {e}"}
            self.wfile.write(json.dumps(answer).encode() + b"\n")


class _Listener(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@dataclass
class _Remote:
    peer: KVPeer
    cache: torch.Tensor  # the peer's cache, [layers, blocks, block_nbytes] bytes
    conn: socket.socket
    reader: Any


def _closed_by_peer(conn: socket.socket) -> bool:
    """True when the peer closed the socket (it died or stopped): the protocol never sends unasked,
    so a readable socket between requests can only be at its end."""
    readable, _, _ = select.select([conn], [], [], 0)
    return bool(readable)


class CudaIpcKVTransport(NotificationInbox, ObservedTransport):
    name = "cuda_ipc"

    def __init__(self, kv_cache: torch.Tensor, worker_name: str, host: str, port: int,
                 metrics: TransferMetrics | None = None) -> None:
        if kv_cache.device.type != "cuda":
            raise ValueError(
                "the cuda_ipc KV transport needs a CUDA KV cache; use nixl or grpc on CPU")
        super().__init__()
        self._name, self._host, self._metrics = worker_name, host, metrics
        self._layout = KVLayout.of(kv_cache)
        self.cache = kv_cache
        self._bytes = byte_view(kv_cache)
        self._stream = torch.cuda.Stream(kv_cache.device)
        self._remotes: dict[str, _Remote] = {}
        self._lock = threading.Lock()
        self._server = _Listener((host, port), _Handler)
        self._server.transport = self  # type: ignore[attr-defined]
        self._port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name=f"cuda-ipc-{worker_name}",
                         daemon=True).start()
        log.info("CUDA IPC KV transport %s: cache of %d bytes, its handle served on %s:%d",
                 worker_name, self._bytes.numel(), host, self._port)

    def local_peer(self) -> KVPeer:
        return KVPeer(self._name, self._host, self._port, self._layout)

    def _read(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
              notification: bytes, timeout_s: float) -> TransferResult:
        check_read(self._layout, peer, remote_blocks, local_blocks)
        start = time.perf_counter()
        # one read at a time per transport: reads share the side stream and the peers' sockets
        with self._lock:
            remote = self._connect(peer, timeout_s)
            if remote_blocks:
                # the caller's stream may still be writing the destination blocks (a bench's
                # zeroing, a reused block's last kernels): the copy must land after them
                self._stream.wait_stream(torch.cuda.current_stream(self._stream.device))
                with torch.cuda.stream(self._stream):
                    copy_blocks(self._bytes, remote.cache, local_blocks, remote_blocks)
                self._stream.synchronize()
            if notification:
                self._notify(remote, notification, start + timeout_s)
        num_bytes = len(remote_blocks) * self._layout.num_layers * self._layout.block_nbytes
        return TransferResult(num_bytes, time.perf_counter() - start)

    def _notify(self, remote: _Remote, notification: bytes, deadline: float) -> None:
        """The blocks are already in place here, so a failure is "failed", never "nothing moved"."""
        try:
            self._ask(remote,
                      {"op": "notify", "msg": base64.b64encode(notification).decode("ascii")},
                      deadline)
        except KVTransferError as e:
            raise KVTransferError(f"{e} (after the copy)", "failed") from e

    def _connect(self, peer: KVPeer, timeout_s: float) -> _Remote:
        cached = self._remotes.get(peer.name)
        if cached is not None and cached.peer == peer and not _closed_by_peer(cached.conn):
            return cached
        # moved, restarted, or gone: its mapping may be of a dead process's cache
        if cached is not None:
            self._drop(peer.name)
        try:
            conn = socket.create_connection((peer.host, peer.port), timeout=timeout_s)
        except OSError as e:
            raise KVTransferError(
                f"CUDA IPC peer {peer.name} at {peer.host}:{peer.port} is unreachable: {e}",
                "unreachable") from e
        remote = _Remote(peer, torch.empty(0), conn, conn.makefile("rb"))
        try:
            fields = self._ask(remote, {"op": "handle"}, time.perf_counter() + timeout_s)["handle"]
        except KVTransferError:
            conn.close()
            raise
        try:
            flat = open_handle(fields)
        except Exception as e:  # torch raises RuntimeError for every CUDA IPC failure
            conn.close()
            raise KVTransferError(f"opening CUDA IPC peer {peer.name}'s cache failed: {e!r}",
                                  "invalid") from e
        layout = peer.layout
        if flat.numel() != layout.num_layers * layout.num_blocks * layout.block_nbytes:
            conn.close()
            raise KVTransferError(
                f"CUDA IPC peer {peer.name} exported {flat.numel()} bytes, not the cache its "
                f"layout describes ({layout})", "invalid")
        remote.cache = flat.view(layout.num_layers, layout.num_blocks, layout.block_nbytes)
        self._remotes[peer.name] = remote
        return remote

    def _ask(self, remote: _Remote, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        """One request and its answer on the peer's socket; a broken socket drops the peer (it may
        be gone)."""
        try:
            remote.conn.settimeout(max(deadline - time.perf_counter(), 0.001))
            remote.conn.sendall(json.dumps(request).encode() + b"\n")
            line = remote.reader.readline()
        except OSError as e:
            self._drop(remote.peer.name, remote)
            reason = "timeout" if isinstance(e, TimeoutError) else "unreachable"
            raise KVTransferError(
                f"CUDA IPC peer {remote.peer.name}: {request['op']} failed: {e!r}", reason) from e
        if not line:
            self._drop(remote.peer.name, remote)
            raise KVTransferError(f"CUDA IPC peer {remote.peer.name} closed the connection",
                                  "unreachable")
        try:
            answer = json.loads(line)
        except ValueError as e:
            self._drop(remote.peer.name, remote)
            raise KVTransferError(f"CUDA IPC peer {remote.peer.name} answered {line[:80]!r}",
                                  "failed") from e
        if "error" in answer:
            raise KVTransferError(
                f"CUDA IPC peer {remote.peer.name} refused {request['op']}: {answer['error']}",
                "invalid")
        return answer

    def _drop(self, name: str, remote: _Remote | None = None) -> None:
        remote = self._remotes.pop(name, None) or remote
        if remote is not None:
            remote.conn.close()

    def close(self) -> None:
        with self._lock:
            for name in list(self._remotes):
                self._drop(name)
        self._server.shutdown()
        self._server.server_close()
