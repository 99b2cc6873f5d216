"""The local-disk tier: one file per block, named by its chained hash, with a checksum.

A file is [magic, block hash, payload length, blake2b-256 of the payload, payload]. It is written
to a temporary name and renamed, so a killed worker leaves whole files or temporary ones (deleted
at start); a file whose header or checksum does not hold when read is a miss: deleted, counted,
never served. Files found at start are indexed by name and size only and trusted no further than
their checksum on read. The first failed write (disk full, unwritable) stops writing, with one log
line and a metric; reads and serving go on.

Not thread-safe: TierManager calls it from the copy worker only, and its index under its lock.
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from baton.services.engine.kv.tiers.stats import TierStats

log = logging.getLogger(__name__)

MAGIC = b"BATONKV1"
# A block's bytes in the head-major cache order (kv/layout.py): another magic, so a directory
# written under one EngineConfig.kv_cache_layout serves no block to the other (a header miss).
MAGICS = {"NHD": MAGIC, "HND": b"BATONKH1"}
# With an EAGLE head the payload is the target's bytes then the head's (host.py): a format of its
# own, so a file written with a head (or without) reads as a miss to an engine without (or with).
HEAD_MAGICS = {"NHD": b"BATONKE1", "HND": b"BATONKF1"}
HEADER = struct.Struct("<8sQQ32s")  # magic, block hash, payload length, checksum
SUFFIX = ".kv"


def _checksum(payload: bytes) -> bytes:
    return hashlib.blake2b(payload, digest_size=32).digest()


def encode(block_hash: int, payload: bytes, magic: bytes = MAGIC) -> bytes:
    return HEADER.pack(magic, block_hash, len(payload), _checksum(payload)) + payload


def decode(block_hash: int, data: bytes, block_bytes: int,
           expected_magic: bytes = MAGIC) -> bytes | None:
    """The payload, or None when the file is not a whole, intact block of this hash."""
    if len(data) != HEADER.size + block_bytes:
        return None
    magic, stored_hash, length, checksum = HEADER.unpack_from(data)
    payload = data[HEADER.size:]
    if magic != expected_magic or stored_hash != block_hash or length != block_bytes:
        return None
    return payload if _checksum(payload) == checksum else None


class DiskTier:

    def __init__(self, directory: str | Path, capacity_bytes: int, block_bytes: int,
                 stats: TierStats,
                 record: Callable[[str, int, str], None] = lambda *_: None,
                 order: str = "NHD", head: bool = False) -> None:
        """record(kind, block hash, "disk"): told of each block that enters or leaves the tier
        after its start (the files found then are in its index). order: the cache's (MAGICS).
        head: payloads carry an EAGLE head's bytes too (HEAD_MAGICS)."""
        self.dir = Path(directory)
        self.magic = (HEAD_MAGICS if head else MAGICS)[order]
        self.record = record
        self.dir.mkdir(parents=True, exist_ok=True)
        self.block_bytes = block_bytes
        self.file_bytes = HEADER.size + block_bytes
        self.capacity = capacity_bytes // self.file_bytes
        self.stats = stats
        self.writable = True
        self.index: OrderedDict[int, None] = OrderedDict()  # block hashes on disk, LRU first
        self._scan()

    def _path(self, block_hash: int) -> Path:
        return self.dir / f"{block_hash:016x}{SUFFIX}"

    def _scan(self) -> None:
        """Indexes the files a previous run left, oldest first; drops torn and foreign ones."""
        found = []
        for path in self.dir.iterdir():
            name = path.name
            if name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                continue
            if not name.endswith(SUFFIX):
                continue
            try:
                block_hash = int(name[:-len(SUFFIX)], 16)
                stat = path.stat()
            except (ValueError, OSError):
                continue
            if stat.st_size != self.file_bytes:
                path.unlink(missing_ok=True)
                continue
            found.append((stat.st_mtime, block_hash))
        for _, block_hash in sorted(found):
            self.index[block_hash] = None
        while len(self.index) > self.capacity:
            self._evict()

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.index

    def __len__(self) -> int:
        return len(self.index)

    @property
    def bytes_used(self) -> int:
        return len(self.index) * self.file_bytes

    def _evict(self) -> None:
        block_hash, _ = self.index.popitem(last=False)
        self._path(block_hash).unlink(missing_ok=True)
        self.record("removed", block_hash, "disk")

    def discard(self, block_hash: int) -> None:
        """Drops a block and its file (under tensor parallelism: another rank's share of it
        failed, replicas.py)."""
        if block_hash in self.index:
            del self.index[block_hash]
            self.record("removed", block_hash, "disk")
        self._path(block_hash).unlink(missing_ok=True)

    def write(self, block_hash: int, payload: bytes) -> bool:
        """Stores a block; False when nothing was written: the tier holds it already, no longer
        writes, or the write failed."""
        if block_hash in self.index:
            self.index.move_to_end(block_hash)
            return False
        if not self.writable or self.capacity < 1:
            return False
        while len(self.index) >= self.capacity:
            self._evict()
        path = self._path(block_hash)
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(encode(block_hash, payload, self.magic))
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            self.writable = False
            self.stats.write_errors += 1
            log.error("KV disk tier %s: write failed (%s); no more blocks are written to it, "
                      "serving goes on", self.dir, e)
            return False
        self.index[block_hash] = None
        self.record("stored", block_hash, "disk")
        return True

    def read(self, block_hash: int) -> bytes | None:
        """The block's payload, or None: absent, unreadable or failing its checksum (then deleted
        and counted)."""
        if block_hash not in self.index:
            return None
        path = self._path(block_hash)
        try:
            data = path.read_bytes()
        except OSError:
            del self.index[block_hash]
            self.record("removed", block_hash, "disk")
            return None
        payload = decode(block_hash, data, self.block_bytes, self.magic)
        if payload is None:
            del self.index[block_hash]
            self.record("removed", block_hash, "disk")
            path.unlink(missing_ok=True)
            self.stats.checksum_failures += 1
            log.warning("KV disk tier: %s failed its checksum; deleted, treated as a miss", path)
            return None
        self.index.move_to_end(block_hash)
        return payload
