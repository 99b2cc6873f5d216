"""The disk tier's files (services/engine/kv/tiers/disk.py): a corrupted block file is a miss
(deleted, counted, never served), a full disk stops writing with one log line and a metric, and a
killed worker's files are trusted after a restart only where their checksums hold. None of it
changes a greedy output."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from baton.services.common.block_hash import block_hashes
from baton.services.engine.kv.tiers.disk import HEADER, MAGICS, DiskTier, decode, encode
from baton.services.engine.kv.tiers.stats import TierStats
from tests.engine.tiers_helpers import (BLOCK_SIZE, DEVICE_BLOCKS, GREEDY, all_hashes,
                                        conversations, engine, gib_for)
from tests.launcher import wait_for

PROMPTS = conversations(6, seed=3)
HOST_BLOCKS = 6  # so that most blocks go on to disk


@pytest.fixture(scope="module")
def reference() -> tuple[list[list[int]], str, float, int]:
    """Outputs without tiers (each prompt run twice), the model id, the small host setting, and
    the bytes of one block."""
    e = engine()
    outputs = [o.token_ids for o in e.generate(PROMPTS + PROMPTS, GREEDY)]
    cache = e.runner.kv_cache
    return outputs, e.model_id, gib_for(e, HOST_BLOCKS), cache[:, 0].numel() * cache.element_size()


def _run(disk_dir: Path, host_gib: float) -> tuple[list[list[int]], object]:
    e = engine(kv_offload_host_gib=host_gib, kv_offload_disk_dir=str(disk_dir))
    try:
        return [o.token_ids for o in e.generate(PROMPTS + PROMPTS, GREEDY)], e.tiers
    finally:
        e.close()


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[HEADER.size + 3] ^= 0xFF  # one payload byte
    path.write_bytes(bytes(data))


def test_file_format_round_trip_and_refusals() -> None:
    payload = bytes(range(256)) * 4
    good = encode(7, payload)
    assert decode(7, good, len(payload)) == payload
    assert decode(8, good, len(payload)) is None  # another block's file
    assert decode(7, good[:-1], len(payload)) is None  # torn
    flipped = bytearray(good)
    flipped[-1] ^= 1
    assert decode(7, bytes(flipped), len(payload)) is None
    # A block written by a head-major cache is no block for a token-major one, and back.
    head_major = encode(7, payload, MAGICS["HND"])
    assert decode(7, head_major, len(payload)) is None
    assert decode(7, head_major, len(payload), MAGICS["HND"]) == payload


def test_corrupted_block_files_change_no_output(reference, tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    outputs, _, host_gib, block_bytes = reference
    first, tiers = _run(tmp_path, host_gib)
    assert first == outputs and tiers.stats["disk"].blocks_stored > 0
    for path in tmp_path.glob("*.kv"):
        _corrupt(path)
    with caplog.at_level(logging.WARNING, "baton.services.engine.kv.tiers.disk"):
        again, tiers = _run(tmp_path, host_gib)  # a restart: every file is found, none holds
    assert again == outputs
    disk = tiers.stats["disk"]
    assert disk.hits > 0 and disk.checksum_failures > 0
    refused = [Path(r.args[0]) for r in caplog.records if "failed its checksum" in r.getMessage()]
    assert len(refused) == disk.checksum_failures
    # Each refused file was deleted (a block stored again later writes a new, whole one).
    for path in refused:
        assert not path.exists() or decode(int(path.stem, 16), path.read_bytes(), block_bytes)


def test_full_disk_stops_writing_and_changes_no_output(reference, tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """Every block file's temporary name points at /dev/full: the first write fails with ENOSPC."""
    outputs, model_id, host_gib, _ = reference
    e = engine(kv_offload_host_gib=host_gib, kv_offload_disk_dir=str(tmp_path))
    sequences = [p + o for p, o in zip(PROMPTS + PROMPTS, outputs)]
    for h in all_hashes(e, sequences):
        os.symlink("/dev/full", tmp_path / f"{h:016x}.kv.tmp")
    try:
        with caplog.at_level(logging.ERROR, "baton.services.engine.kv.tiers.disk"):
            got = [o.token_ids for o in e.generate(PROMPTS + PROMPTS, GREEDY)]
            e.close()  # every copy done, the disk writes tried
        assert got == outputs
        disk = e.tiers.stats["disk"]
        assert disk.write_errors == 1 and not e.tiers.disk.writable
        assert disk.blocks_stored == 0 and not list(tmp_path.glob("*.kv"))
        lines = [r for r in caplog.records if "write failed" in r.getMessage()]
        assert len(lines) == 1 and "No space left" in lines[0].getMessage()
        assert e.tiers.stats["host"].blocks_stored > HOST_BLOCKS  # the host tier goes on
    finally:
        e.close()


WRITER = textwrap.dedent("""
    import sys, time
    from tests.engine.tiers_helpers import GREEDY, conversations, engine
    e = engine(kv_offload_host_gib=float(sys.argv[1]), kv_offload_disk_dir=sys.argv[2])
    e.generate(conversations(6, seed=3), GREEDY)
    e.tiers.flush()  # every block it evicted is on disk; then the kill
    print("written", flush=True)
    time.sleep(600)
""")


def test_killed_workers_files_are_trusted_only_where_checksums_hold(reference,
                                                                    tmp_path: Path) -> None:
    outputs, model_id, host_gib, block_bytes = reference
    root = Path(__file__).resolve().parents[2]
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(host_gib), str(tmp_path)],
                              cwd=root, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(root)})
    try:
        assert writer.stdout.readline().strip() == "written"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=60)
    # What a kill can leave besides whole files: a torn temporary file, a truncated file.
    (tmp_path / "00000000000000ff.kv.tmp").write_bytes(b"partial")
    on_disk = {int(p.stem, 16): p for p in tmp_path.glob("*.kv")}
    firsts = [block_hashes(p, BLOCK_SIZE, model_id)[0] for p in PROMPTS]
    bad = [h for h in firsts if h in on_disk][:2]
    assert len(bad) == 2, "the writer's first blocks should have reached disk"
    _corrupt(on_disk[bad[0]])
    on_disk[bad[1]].write_bytes(on_disk[bad[1]].read_bytes()[:100])
    stats = TierStats()
    scanned = DiskTier(tmp_path, 1 << 30, block_bytes, stats)
    assert bad[1] not in scanned and bad[0] in scanned  # torn: dropped on sight; corrupt: on read
    assert not (tmp_path / "00000000000000ff.kv.tmp").exists()
    got, tiers = _run(tmp_path, host_gib)
    assert got == outputs
    disk = tiers.stats["disk"]
    assert disk.checksum_failures >= 1
    corrupt = on_disk[bad[0]]  # deleted on read; if its block was stored again, whole this time
    assert not corrupt.exists() or decode(bad[0], corrupt.read_bytes(), block_bytes)
    assert disk.blocks_loaded > 0  # the whole files were trusted
