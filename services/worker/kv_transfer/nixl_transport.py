"""The NIXL transport: one-sided READs of a peer's registered KV cache over UCX.

The whole cache is registered once, and both sides' (layer, block) ranges are prepared once as
descriptor lists (the local one at start-up, a peer's on first contact), so a read only picks
indices: one prepped READ moves every layer of every requested block and carries the notification
that tells the peer its blocks may be released.

A read whose blocks form consecutive runs on both sides is instead built from one range per (layer,
run) (descriptors.py), so UCX moves a few large pieces rather than many 64 KiB ones.

An EAGLE head's one-layer cache, registered too, is read in the same READ as the target's blocks
(its ranges after theirs, one notification) when both workers have a head cache of one shape
(base.heads_match); a read across tensor-parallel sizes reads it from prefill rank 0 on its own
(read_head), before the notification.

On host memory UCX_TLS is left to UCX on purpose: its default picks shared memory / CMA between
processes of one host and RDMA or TCP across hosts, and it is what the listener-based metadata
exchange was verified with. Restricting it to `shm,self` fails to create the agent, and `tcp` alone
works but is slower on one host. On GPU memory the transport first sets UCX up for its CUDA
transports (nixl_loader.configure_ucx_for_cuda).
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from baton.services.engine.kv.layout import KVLayout, storage
from baton.services.worker.kv_transfer.base import (KVPeer, KVTransferError, TransferResult,
                                                    check_read, heads_match)
from baton.services.worker.kv_transfer.descriptors import (HeadSlice, check_head_read,
                                                           coalesced_tables, head_slice_tables,
                                                           run_tables)
from baton.services.worker.kv_transfer.nixl_loader import (configure_ucx_for_cuda, load_nixl,
                                                           new_agent)
from baton.services.worker.kv_transfer.telemetry import ObservedTransport, TransferMetrics

__all__ = ["NixlKVTransport", "descriptor_indices", "descriptor_table", "load_nixl"]

log = logging.getLogger(__name__)

# A re-fetch every so often: the listener's cached socket to a restarted peer fails once before it
# reconnects.
METADATA_REFETCH_S = 0.1
# Polling starts with a short spin so small reads are not rounded up to a sleep; then it backs off.
SPIN_S, MAX_SLEEP_S = 0.0002, 0.001


def descriptor_table(layout: KVLayout, device_id: int) -> np.ndarray:
    """(address, length, device) of every (layer, block), row `layer * num_blocks + block`."""
    offsets = np.arange(layout.num_layers * layout.num_blocks, dtype=np.uint64) * np.uint64(
        layout.block_nbytes)
    table = np.empty((offsets.size, 3), dtype=np.uint64)
    table[:, 0] = np.uint64(layout.base_address) + offsets
    table[:, 1] = layout.block_nbytes
    table[:, 2] = device_id
    return table


def descriptor_indices(num_layers: int, num_blocks: int, blocks: list[int]) -> np.ndarray:
    """Rows of `descriptor_table` for every layer of `blocks`, layer-major (the order both sides
    must agree on)."""
    layer_rows = np.arange(num_layers, dtype=np.int64)[:, None] * num_blocks
    return (layer_rows + np.asarray(blocks, dtype=np.int64)[None, :]).ravel().astype(np.int32)


@dataclass
class _Remote:
    peer: KVPeer
    dlist: Any  # the peer's prepared descriptor list


class NixlKVTransport(ObservedTransport):
    name = "nixl"

    def __init__(self, kv_cache: torch.Tensor, agent_name: str, host: str, port: int,
                 metrics: TransferMetrics | None = None, ucx_tls: str | None = None,
                 head_cache: torch.Tensor | None = None) -> None:
        if kv_cache.device.type == "cuda":
            configure_ucx_for_cuda(ucx_tls)
        self._cache, self._host, self._port, self._metrics = kv_cache, host, port, metrics
        self._layout = KVLayout.of(kv_cache)
        self._mem_type = "DRAM" if kv_cache.device.type == "cpu" else "VRAM"
        self._device_id = max(kv_cache.get_device(), 0)
        self._agent = new_agent(agent_name, port)
        self._agent_name = agent_name
        self._registered = self._agent.register_memory(storage(kv_cache))
        self._head_layout = None if head_cache is None else KVLayout.of(head_cache)
        self._head_registered = None if head_cache is None else self._agent.register_memory(
            storage(head_cache))
        self._local_dlist = self._agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", descriptor_table(self._layout, self._device_id), self._mem_type)
        self._remotes: dict[str, _Remote] = {}
        # Guards _remotes and every use of a remote's dlist handle, so no read builds a transfer
        # from a handle that a failing read on another thread is releasing.
        self._lock = threading.Lock()
        log.info(
            "NIXL agent %s: %d (layer, block) ranges of %d bytes registered, metadata on port %d",
            agent_name, self._layout.num_layers * self._layout.num_blocks,
            self._layout.block_nbytes, port)

    def local_peer(self) -> KVPeer:
        return KVPeer(self._agent_name, self._host, self._port, self._layout,
                      head_layout=self._head_layout)

    def _read(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
              notification: bytes, timeout_s: float) -> TransferResult:
        check_read(self._layout, peer, remote_blocks, local_blocks)
        head = heads_match(self._head_layout, peer.head_layout)
        return self._read_retried(peer, remote_blocks, local_blocks, notification, timeout_s,
                                  regions=("kv", "head") if head else ("kv",))

    def read_head(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
                  timeout_s: float) -> TransferResult:
        """The EAGLE head's blocks alone, without a notification (head_transport.py reads the
        target's by rank, then notifies). Raises KVTransferError."""
        if not heads_match(self._head_layout, peer.head_layout):
            raise KVTransferError(f"peer {peer.name} has no EAGLE head cache like this one's",
                                  "invalid")
        check_read(self._head_layout, replace(peer, layout=peer.head_layout), remote_blocks,
                   local_blocks)
        return self._read_retried(peer, remote_blocks, local_blocks, b"", timeout_s,
                                  regions=("head",))

    def read_heads(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
                   part: HeadSlice, timeout_s: float) -> TransferResult:
        """One tensor-parallel rank's share of a read across TP sizes: `part`'s heads of every
        layer of the blocks, without a notification (head_transport.py sends one when every rank
        is done); unobserved, the caller counts the whole read. Raises KVTransferError."""
        check_head_read(self._layout, peer, remote_blocks, local_blocks, part)
        whole = (part.count == part.remote_heads == part.local_heads
                 and peer.layout.order == self._layout.order)
        return self._read_retried(peer, remote_blocks, local_blocks, b"", timeout_s,
                                  None if whole else part)

    def notify(self, peer: KVPeer, notification: bytes, timeout_s: float) -> None:
        """Tells the peer a read of its blocks is over, as a read's own notification would."""
        self._read_retried(peer, [], [], notification, timeout_s)

    def _read_retried(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
                      notification: bytes, timeout_s: float, part: HeadSlice | None = None,
                      regions: tuple[str, ...] = ("kv",)) -> TransferResult:
        """regions: the caches read, "kv" (the target's, or `part` of it) and "head"."""
        start = time.perf_counter()
        deadline = start + timeout_s
        read = (peer, remote_blocks, local_blocks, notification, deadline, part, regions)
        try:
            self._read_once(*read)
        except _StaleConnection as e:
            # A peer restarted under the same name leaves our cached metadata pointing at its dead
            # endpoint; the failure happened before anything was posted, so a fresh connection may
            # simply try again.
            log.info(
                "KV read over nixl for request %s: cached connection to %s is stale (%s); "
                "reconnecting",
                notification.decode("utf-8", "replace"), peer.name, e)
            self._read_once(*read)
        block_nbytes = self._layout.block_nbytes if part is None else (
            self._layout.block_nbytes * part.count // part.local_heads)
        per_block = (self._layout.num_layers * block_nbytes if "kv" in regions else 0) + (
            self._head_layout.block_nbytes if "head" in regions else 0)
        return TransferResult(len(remote_blocks) * per_block, time.perf_counter() - start)

    def _read_once(self, peer: KVPeer, remote_blocks: list[int], local_blocks: list[int],
                   notification: bytes, deadline: float, part: HeadSlice | None,
                   regions: tuple[str, ...]) -> None:
        fresh = self._connect(peer, deadline)
        if not remote_blocks:
            self._notify(peer, notification, fresh)
            return
        with self._lock:
            remote = self._remotes.get(peer.name)
            if remote is None:
                raise KVTransferError(
                    f"NIXL peer {peer.name} was dropped by a concurrent failed read", "failed")
            try:
                handle = self._make_read(peer, remote, remote_blocks, local_blocks, notification,
                                         part, regions)
            except Exception as e:  # the bindings raise one unrelated class per NIXL status
                self._drop_locked(peer.name)
                raise _failure(peer, f"preparing the READ failed: {e!r}", fresh) from e
        self._run(handle, peer, fresh, deadline)

    def _make_read(self, peer: KVPeer, remote: _Remote, remote_blocks: list[int],
                   local_blocks: list[int], notification: bytes, part: HeadSlice | None,
                   regions: tuple[str, ...]) -> Any:
        """A READ of a head slice, or with the EAGLE head's blocks, or over merged runs where
        blocks are consecutive on both sides, else over the prepared lists."""
        if "head" in regions:
            pairs = [(self._head_layout, peer.head_layout)]
            if "kv" in regions:
                pairs.insert(0, (self._layout, peer.layout))
            tables = run_tables(pairs, remote_blocks, local_blocks, self._device_id)
        elif part is not None:
            tables = head_slice_tables(self._layout, peer.layout, remote_blocks, local_blocks,
                                       part, self._device_id, self._device_id)
        else:
            tables = coalesced_tables(self._layout, peer.layout, remote_blocks, local_blocks,
                                      self._device_id, self._device_id)
        if tables is not None:
            local_descs = self._agent.get_xfer_descs(tables[0], self._mem_type)
            remote_descs = self._agent.get_xfer_descs(tables[1], self._mem_type)
            return self._agent.initialize_xfer("READ", local_descs, remote_descs, peer.name,
                                               notification)
        layers = self._layout.num_layers
        local_ids = descriptor_indices(layers, self._layout.num_blocks, local_blocks)
        remote_ids = descriptor_indices(layers, peer.layout.num_blocks, remote_blocks)
        return self._agent.make_prepped_xfer("READ", self._local_dlist, local_ids, remote.dlist,
                                             remote_ids, notification)

    def _run(self, handle: Any, peer: KVPeer, fresh: bool, deadline: float) -> None:
        """Posts the READ and polls it to DONE; on any other outcome releases it and drops the
        peer."""
        try:
            state = self._agent.transfer(handle)
        except Exception as e:
            self._abandon(handle, peer)
            raise _failure(peer, f"posting the READ failed: {e!r}", fresh) from e
        try:
            state = self._poll(handle, state, deadline)
        except Exception as e:
            self._abandon(handle, peer)
            raise KVTransferError(
                f"NIXL READ from {peer.name} ({peer.host}:{peer.port}) broke: {e!r}") from e
        if state == "DONE":
            self._agent.release_xfer_handle(handle)
            return
        self._abandon(handle, peer)
        if state == "PROC":
            raise KVTransferError(
                f"NIXL READ from {peer.name} ({peer.host}:{peer.port}) did not complete in time",
                "timeout")
        raise KVTransferError(
            f"NIXL READ from {peer.name} ({peer.host}:{peer.port}) failed (state {state})",
            "failed")

    def _poll(self, handle: Any, state: str, deadline: float) -> str:
        spin_until, sleep_s = time.perf_counter() + SPIN_S, 0.0
        while state == "PROC" and time.perf_counter() < deadline:
            if time.perf_counter() >= spin_until:
                sleep_s = min(MAX_SLEEP_S, sleep_s * 2 or 0.00005)
                time.sleep(sleep_s)
            state = self._agent.check_xfer_state(handle)
        return state

    def _abandon(self, handle: Any, peer: KVPeer) -> None:
        try:
            self._agent.release_xfer_handle(handle)
        except Exception as e:
            # NIXL keeps a handle it could not cancel and frees it with the agent; nothing else to
            # do here.
            log.debug("NIXL READ handle from %s not released: %r", peer.name, e)
        self._drop(peer.name)

    def _notify(self, peer: KVPeer, notification: bytes, fresh: bool) -> None:
        """An empty read still tells the peer it is done (the decode side had every block
        already)."""
        if not notification:
            return
        try:
            self._agent.send_notif(peer.name, notification)
        except Exception as e:
            self._drop(peer.name)
            raise _failure(peer, f"sending the notification failed: {e!r}", fresh) from e

    def _connect(self, peer: KVPeer, deadline: float) -> bool:
        """Makes sure the peer's metadata and descriptor list are loaded; True when this call loaded
        them."""
        with self._lock:
            cached = self._remotes.get(peer.name)
            if cached is not None and cached.peer == peer:
                return False
            if cached is not None:  # moved or restarted with a new cache: the old metadata is wrong
                self._drop_locked(peer.name)
            self._fetch_metadata(peer, deadline)
            try:
                dlist = self._agent.prep_xfer_dlist(peer.name,
                                                    descriptor_table(peer.layout, self._device_id),
                                                    self._mem_type)
            except Exception as e:
                self._forget_agent(peer.name)
                raise KVTransferError(
                    f"NIXL peer {peer.name} has not registered the cache its layout describes "
                    f"({peer.layout}): {e!r}", "invalid") from e
            self._remotes[peer.name] = _Remote(peer, dlist)
            return True

    def _fetch_metadata(self, peer: KVPeer, deadline: float) -> None:
        if self._agent.check_remote_metadata(peer.name):
            return
        _probe_listener(peer, deadline)
        next_fetch = 0.0
        while not self._agent.check_remote_metadata(peer.name):
            now = time.perf_counter()
            if now >= deadline:
                raise KVTransferError(
                    f"NIXL peer {peer.name} sent no metadata from {peer.host}:{peer.port} in time",
                    "unreachable")
            if now >= next_fetch:
                self._agent.fetch_remote_metadata(peer.name, peer.host, peer.port)
                next_fetch = now + METADATA_REFETCH_S
            time.sleep(0.002)

    def _drop(self, name: str) -> None:
        with self._lock:
            self._drop_locked(name)

    def _drop_locked(self, name: str) -> None:
        """Forgets a peer entirely, so the next read fetches fresh metadata (a restarted peer gets
        new addresses)."""
        remote = self._remotes.pop(name, None)
        if remote is None:
            return
        self._agent.release_dlist_handle(remote.dlist)
        self._forget_agent(name)

    def _forget_agent(self, name: str) -> None:
        try:
            self._agent.remove_remote_agent(name)
        except Exception as e:
            log.debug("NIXL peer %s: removing its metadata failed: %r", name, e)

    def take_notifications(self) -> list[bytes]:
        return [msg for msgs in self._agent.get_new_notifs().values() for msg in msgs]

    def close(self) -> None:
        with self._lock:
            for name in list(self._remotes):
                self._drop_locked(name)
        self._agent.release_dlist_handle(self._local_dlist)
        self._agent.deregister_memory(self._registered)
        if self._head_registered is not None:
            self._agent.deregister_memory(self._head_registered)
        # Dropping the agent (and the handle that refers to it) stops its listener thread and frees
        # the port, for a transport re-made in-process.
        self._agent = self._local_dlist = None
        log.info("NIXL agent %s closed", self._agent_name)


def _probe_listener(peer: KVPeer, deadline: float) -> None:
    """NIXL only retries a refused metadata fetch until our deadline; a plain connect tells at once
    that the peer is down (its listener port is closed), so the caller can recompute right away."""
    try:
        with socket.create_connection((peer.host, peer.port),
                                      timeout=max(deadline - time.perf_counter(), 0.01)):
            pass
    except OSError as e:
        raise KVTransferError(
            f"NIXL peer {peer.name}'s metadata listener at {peer.host}:{peer.port} is unreachable: "
            f"{e}", "unreachable") from e


class _StaleConnection(KVTransferError):
    """A failure on a connection cached from an earlier read, before any byte was posted."""


def _failure(peer: KVPeer, what: str, fresh: bool) -> KVTransferError:
    message = f"NIXL READ from {peer.name} ({peer.host}:{peer.port}): {what}"
    return KVTransferError(message, "unreachable") if fresh else _StaleConnection(
        message, "unreachable")
