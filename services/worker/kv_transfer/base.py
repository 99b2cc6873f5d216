"""The KV transport contract: how a decode worker READs a prefill worker's leased KV blocks into its
own cache.

Both workers hold a paged cache of the same per-block shape (baton.services.engine.kv.layout), so
each (layer, block) is one contiguous range that a transport moves; the two caches may differ in
their number of blocks, never in the per-block shape. The in-block order (NHD or HND) must match
for whole-block copies; the NIXL transport alone reads across orders, in smaller pieces
(descriptors.head_slice_tables).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields

from baton.services.engine.kv.layout import KVLayout
from baton.v1 import worker_pb2 as pb


class KVTransferError(RuntimeError):
    """A read that failed or timed out; the decode worker then recomputes the prompt (or fails, by
    policy).

    `reason` labels the failure metric and tells the caller what became of its local blocks:
    "invalid" and "unreachable": nothing was moved; "failed": the read broke, the local blocks may
    hold part of it; "timeout": a NIXL READ may still land after the error (UCX cannot cancel a
    posted READ: seen on loopback over TCP with a stalled peer), so the local blocks must not be
    given to another request until the peer is gone.
    """

    def __init__(self, message: str, reason: str = "failed") -> None:
        super().__init__(message)
        self.reason = reason


def layout_to_proto(layout: KVLayout) -> pb.KVLayout:
    """Field by field, by name: KVLayout and its message have the same fields (a test in tests/proto
    holds them equal)."""
    return pb.KVLayout(**asdict(layout))


def layout_from_proto(message: pb.KVLayout) -> KVLayout:
    values = {f.name: getattr(message, f.name) for f in fields(KVLayout)}
    return KVLayout(**values | {"order": message.order or "NHD"})


@dataclass(frozen=True)
class KVRankPeer:
    """One tensor-parallel rank's NIXL agent and the KV heads its cache holds (the fields of the
    KVRankPeer message)."""
    agent_name: str
    agent_host: str
    agent_port: int
    layout: KVLayout
    kv_head_start: int
    kv_head_count: int


@dataclass(frozen=True)
class KVPeer:
    """How to reach a worker's KV memory; every KV handle carries its prefill worker's."""
    name: str  # NIXL agent name (unique per worker process)
    host: str
    port: int  # the NIXL metadata listener's port, or the worker's gRPC port for the gRPC transport
    layout: KVLayout
    # Under tensor parallelism every rank's agent, rank 0's (the fields above) first; else empty.
    ranks: tuple[KVRankPeer, ...] = ()
    # The EAGLE head's one-layer cache beside the KV cache (rank 0's), if any.
    head_layout: KVLayout | None = None


@dataclass(frozen=True)
class KVHandle:
    """Where a decode worker reads a prompt's KV from: the prefill worker's leased blocks, and how
    to reach them (the fields of the KVHandle message, by the same names)."""
    request_id: str
    worker_id: str
    worker_address: str  # host:port of the prefill worker's gRPC service (leases, PullKV)
    transport: str  # "nixl" or "grpc"
    agent_name: str  # NIXL agent name
    agent_host: str  # where the NIXL agent's metadata listener is
    agent_port: int
    layout: KVLayout
    block_ids: tuple[int, ...]
    num_tokens: int  # prompt tokens whose KV the blocks hold
    expires_at_unix_ms: int
    # Prefix-cache keys of the full blocks, so the decode side can skip hits.
    block_hashes: tuple[int, ...]
    # Every prefill rank's agent and KV heads under tensor parallelism; empty: one cache.
    rank_peers: tuple[KVRankPeer, ...] = ()
    # The prefill worker's EAGLE head cache, and the prompt's last target row (float32 bytes).
    head_layout: KVLayout | None = None
    head_row: bytes = b""


def _rank_peer_to_proto(peer: KVRankPeer) -> pb.KVRankPeer:
    values = {f.name: getattr(peer, f.name) for f in fields(KVRankPeer)}
    return pb.KVRankPeer(**values | {"layout": layout_to_proto(peer.layout)})


def _rank_peer_from_proto(message: pb.KVRankPeer) -> KVRankPeer:
    values = {f.name: getattr(message, f.name) for f in fields(KVRankPeer)}
    return KVRankPeer(**values | {"layout": layout_from_proto(message.layout)})


def kv_handle_to_proto(handle: KVHandle) -> pb.KVHandle:
    values = {f.name: getattr(handle, f.name) for f in fields(KVHandle)}
    head = handle.head_layout
    return pb.KVHandle(**values | {"layout": layout_to_proto(handle.layout), "rank_peers": [
        _rank_peer_to_proto(p) for p in handle.rank_peers],
        "head_layout": None if head is None else layout_to_proto(head)})


def kv_handle_from_proto(message: pb.KVHandle) -> KVHandle:
    """Field by field, by name, like the layout; a test in tests/proto holds the fields equal."""
    values = {f.name: getattr(message, f.name) for f in fields(KVHandle)}
    return KVHandle(**values | {"layout": layout_from_proto(message.layout),
                                "block_ids": tuple(message.block_ids),
                                "block_hashes": tuple(message.block_hashes),
                                "rank_peers": tuple(_rank_peer_from_proto(p)
                                                    for p in message.rank_peers),
                                "head_layout": layout_from_proto(message.head_layout)
                                if message.HasField("head_layout") else None})


@dataclass(frozen=True)
class TransferResult:
    num_bytes: int
    seconds: float


class KVTransport(ABC):
    """One per worker. The prefill side only registers its cache and answers; the decode side calls
    `read`."""

    name: str  # "nixl", "grpc" or "cuda_ipc"

    @abstractmethod
    def local_peer(self) -> KVPeer:
        """This worker's own reachability, to put in the KV handles it hands out."""

    @abstractmethod
    def read(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
             notification: bytes, timeout_s: float) -> TransferResult:
        """Copies every layer of remote_blocks[i] into local_blocks[i]; blocking, so call it off the
        event loop. On success the peer receives `notification` (see `take_notifications`). Raises
        KVTransferError."""

    def rank_peers(self) -> tuple[KVRankPeer, ...]:
        """Every tensor-parallel rank's agent and KV heads, for the handles it hands out; empty
        for a transport over one cache."""
        return ()

    @abstractmethod
    def take_notifications(self) -> list[bytes]:
        """Prefill side: notifications of reads that completed since the last call."""

    @abstractmethod
    def close(self) -> None:
        """Releases registered memory and connections."""


class NotificationInbox:
    """Read notices that reach the prefill side through a listener of this worker's own (the PullKV
    servicer, the CUDA IPC socket) rather than through a library that keeps them (NIXL): they wait
    here, appended on the listener's thread, until the worker's housekeeping takes them."""

    def __init__(self) -> None:
        self._notifications: deque[bytes] = deque()

    def record_notification(self, msg: bytes) -> None:
        """A pull finished: `take_notifications` hands `msg` to the prefill side."""
        self._notifications.append(msg)

    def take_notifications(self) -> list[bytes]:
        # popleft, not a copy then clear: a notice appended in between would be lost
        taken = []
        while self._notifications:
            taken.append(self._notifications.popleft())
        return taken


class KVStreamSource(ABC):
    """The prefill side of a transport that the decode side pulls from over the worker's own gRPC
    port: the worker's PullKV servicer streams the blocks from here, then reports the completed
    read."""

    @abstractmethod
    def stream_blocks(self, block_ids: list[int], with_head: bool = False) -> Iterator[pb.KVChunk]:
        """Every layer of `block_ids`, layer-major (with_head: the EAGLE head's after them).
        Raises KVTransferError ("invalid") at once for an unknown block id, before the stream
        starts."""

    @abstractmethod
    def record_notification(self, msg: bytes) -> None:
        """A pull finished: `take_notifications` hands `msg` to the prefill side."""


def heads_match(local: KVLayout | None, remote: KVLayout | None) -> bool:
    """Whether a read moves the EAGLE head's blocks too: both workers have a head cache, of one
    block shape and order (a different head, or none, on either side: the target's alone)."""
    if local is None or remote is None:
        return False
    return (remote.num_layers, remote.block_size, remote.block_nbytes, remote.dtype,
            remote.order) == (local.num_layers, local.block_size, local.block_nbytes,
                              local.dtype, local.order)


def check_read(local: KVLayout, peer: KVPeer, remote_blocks: list[int],
               local_blocks: list[int]) -> None:
    """Refuses, before anything moves, a read that the two layouts cannot serve. Raises
    KVTransferError."""
    remote = peer.layout
    if (remote.num_layers, remote.block_size, remote.block_nbytes, remote.dtype) != (
            local.num_layers, local.block_size, local.block_nbytes, local.dtype):
        raise KVTransferError(
            f"peer {peer.name}'s cache layout {remote} does not match the local one {local}",
            "invalid")
    if remote.order != local.order:
        raise KVTransferError(
            f"peer {peer.name}'s cache is {remote.order} but the local one is {local.order}: "
            "whole-block copies need one --kv-cache-layout on both pools (only the nixl "
            "transport converts)", "invalid")
    if len(remote_blocks) != len(local_blocks):
        raise KVTransferError(
            f"{len(remote_blocks)} remote blocks but {len(local_blocks)} local blocks", "invalid")
    _check_ids(remote_blocks, remote.num_blocks, f"remote block id (peer {peer.name})")
    _check_ids(local_blocks, local.num_blocks, "local block id")
    if len(set(local_blocks)) != len(local_blocks):
        raise KVTransferError(
            f"local block ids {local_blocks} repeat: two blocks would land on one", "invalid")


def _check_ids(ids: list[int], num_blocks: int, what: str) -> None:
    bad = [i for i in ids if not 0 <= i < num_blocks]
    if bad:
        raise KVTransferError(f"invalid {what} {bad[0]}: the cache has blocks 0..{num_blocks - 1}",
                              "invalid")
