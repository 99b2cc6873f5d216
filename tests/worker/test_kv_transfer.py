"""Both KV transports between two real processes on loopback: a spawned source with a cache of
seeded random bytes, and this process reading from it."""
from __future__ import annotations

import json
import os
import time
from random import Random
from pathlib import Path
from typing import Iterator

import grpc
import pytest
import torch
from prometheus_client import CollectorRegistry

from baton.loadtest.bench.kv_loopback import CacheShape, SourceProcess, SourceSpec, random_cache
from baton.loadtest.commands.bench_kv_transfer import pick_blocks
from baton.services.cli.main import main
from baton.services.common.process import free_port
from baton.services.engine.kv.layout import byte_view
from baton.services.worker.kv_transfer import KVTransferError, KVTransport, make_transport
from baton.v1 import worker_pb2, worker_pb2_grpc

KINDS = ("nixl", "grpc")
SOURCE_SHAPE = CacheShape(num_layers=3, num_blocks=10, block_size=4, kv_heads=2, head_dim=8)
# a different count
LOCAL_SHAPE = CacheShape(num_layers=3, num_blocks=7, block_size=4, kv_heads=2, head_dim=8)
SEED = 1234
TIMEOUT_S = 3.0


def _spec(tag: str) -> SourceSpec:
    return SourceSpec(SOURCE_SHAPE, SEED, f"kv-src-{tag}-{os.getpid()}", free_port(), free_port())


@pytest.fixture(scope="module")
def source() -> Iterator[SourceProcess]:
    process = SourceProcess(_spec("main")).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def expected() -> torch.Tensor:
    return byte_view(random_cache(SOURCE_SHAPE, SEED))


@pytest.fixture(scope="module")
def local_cache() -> torch.Tensor:
    return torch.zeros(LOCAL_SHAPE.dims(), dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def transports(local_cache: torch.Tensor) -> Iterator[dict[str, KVTransport]]:
    made = {kind: make_transport(kind, local_cache, f"kv-dst-{os.getpid()}", "127.0.0.1",
                                 free_port() if kind == "nixl" else 0, registry=CollectorRegistry())
            for kind in KINDS}
    yield made
    for transport in made.values():
        transport.close()


def _wait_notifications(source: SourceProcess, kind: str, wanted: set[bytes],
                        wait_s: float = 5.0) -> set[bytes]:
    seen: set[bytes] = set()
    deadline = time.monotonic() + wait_s
    while not wanted <= seen and time.monotonic() < deadline:
        seen.update(source.notifications()[kind])
        time.sleep(0.02)
    return seen


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("remote_blocks, local_blocks", [
    ([9, 2, 5, 0], [0, 6, 3, 4]),  # scattered: NIXL uses its prepared per-(layer, block) lists
    ([2, 3, 4, 5, 8, 9], [0, 1, 2, 3, 5, 6]),  # two runs: NIXL reads one range per (layer, run)
])
def test_read_subset_into_other_blocks(kind: str, remote_blocks: list[int], local_blocks: list[int],
                                       source: SourceProcess, transports: dict[str, KVTransport],
                                       local_cache: torch.Tensor, expected: torch.Tensor) -> None:
    local_cache.zero_()
    note = f"req-{kind}-subset-{remote_blocks[0]}".encode()
    result = transports[kind].read(source.peers[kind], remote_blocks, local_blocks, note, TIMEOUT_S)
    assert result.num_bytes == len(
        remote_blocks) * SOURCE_SHAPE.num_layers * SOURCE_SHAPE.block_nbytes()
    got = byte_view(local_cache)
    for layer in range(SOURCE_SHAPE.num_layers):
        for remote, local in zip(remote_blocks, local_blocks):
            assert torch.equal(got[layer, local], expected[layer,
                                                           remote]), (kind, layer, remote, local)
    untouched = [b for b in range(LOCAL_SHAPE.num_blocks) if b not in local_blocks]
    assert not got[:, untouched].any(), "a block that was not asked for was written"
    assert note in _wait_notifications(source, kind, {note})


@pytest.mark.parametrize("kind", KINDS)
def test_empty_read_still_notifies(kind: str, source: SourceProcess,
                                   transports: dict[str, KVTransport]) -> None:
    note = f"req-{kind}-empty".encode()
    assert transports[kind].read(source.peers[kind], [], [], note, TIMEOUT_S).num_bytes == 0
    assert note in _wait_notifications(source, kind, {note})


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("remote_blocks, local_blocks, message", [
    ([10], [0], "invalid remote block id"),
    ([-1], [0], "invalid remote block id"),
    ([1], [7], "invalid local block id"),
    ([1, 2], [3, 3], "repeat"),
    ([1, 2], [3], "2 remote blocks but 1 local"),
])
def test_invalid_block_ids_are_refused(kind: str, remote_blocks: list[int], local_blocks: list[int],
                                       message: str, source: SourceProcess,
                                       transports: dict[str, KVTransport]) -> None:
    with pytest.raises(KVTransferError, match=message) as failure:
        transports[kind].read(source.peers[kind], remote_blocks, local_blocks, b"req-invalid",
                              TIMEOUT_S)
    assert failure.value.reason == "invalid"


def test_grpc_server_refuses_invalid_block_id(source: SourceProcess) -> None:
    """The servicer's own check, for a client that skipped it."""
    peer = source.peers["grpc"]
    with grpc.insecure_channel(f"{peer.host}:{peer.port}") as channel:
        call = worker_pb2_grpc.WorkerStub(channel).PullKV(
            worker_pb2.PullKVRequest(request_id="req-raw", block_ids=[1, 99]), timeout=TIMEOUT_S)
        with pytest.raises(grpc.RpcError) as failure:
            list(call)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "invalid block id 99" in failure.value.details()


def test_metrics_count_bytes_and_failures(source: SourceProcess, local_cache: torch.Tensor) -> None:
    registry = CollectorRegistry()
    transport = make_transport("grpc", local_cache, "kv-metrics", "127.0.0.1", 0, registry=registry)
    try:
        transport.read(source.peers["grpc"], [1, 2], [0, 1], b"req-metrics", TIMEOUT_S)
        with pytest.raises(KVTransferError):
            transport.read(source.peers["grpc"], [42], [0], b"req-metrics-bad", TIMEOUT_S)
    finally:
        transport.close()
    labels = {"transport": "grpc"}
    assert registry.get_sample_value("baton_kv_transfer_bytes_total",
                                     labels) == 2 * 3 * SOURCE_SHAPE.block_nbytes()
    assert registry.get_sample_value("baton_kv_transfer_duration_seconds_count", labels) == 1
    assert registry.get_sample_value("baton_kv_transfer_failures_total",
                                     {**labels, "reason": "invalid"}) == 1


def _read_in_time(transport: KVTransport, source: SourceProcess, kind: str,
                  timeout_s: float) -> str | None:
    """The failure's reason, or None when the read succeeded; either way within the timeout."""
    start = time.monotonic()
    try:
        transport.read(source.peers[kind], [1, 2], [0, 1], f"req-{kind}-dead".encode(), timeout_s)
        reason = None
    except KVTransferError as e:
        reason = e.reason
    assert time.monotonic() - start < timeout_s + 1.0, "the read outlived its timeout"
    return reason


def _read_matches(transport: KVTransport, source: SourceProcess, kind: str,
                  local_cache: torch.Tensor, expected: torch.Tensor) -> None:
    local_cache.zero_()
    transport.read(source.peers[kind], [8, 3], [2, 5], f"req-{kind}-alive".encode(), TIMEOUT_S)
    got = byte_view(local_cache)
    assert torch.equal(got[:, [2, 5]], expected[:, [8, 3]])


@pytest.mark.timeout(120)
def test_killed_peer_fails_within_timeout_and_restarted_peer_is_readable(
        transports: dict[str, KVTransport], local_cache: torch.Tensor,
        expected: torch.Tensor) -> None:
    victim = SourceProcess(_spec("victim")).start()
    try:
        for kind in KINDS:
            _read_matches(transports[kind], victim, kind, local_cache, expected)
        victim.pause()
        try:
            # A one-sided NIXL READ may complete without the stopped peer's CPU (shared memory /
            # CMA); gRPC cannot.
            assert _read_in_time(transports["nixl"], victim, "nixl", 1.0) in (None, "timeout")
            assert _read_in_time(transports["grpc"], victim, "grpc", 1.0) == "timeout"
        finally:
            victim.resume()
        victim.kill()
        for kind in KINDS:
            # How the first read learns of the death depends on whether UCX has noticed it yet; it
            # must just fail.
            assert _read_in_time(transports[kind], victim, kind, TIMEOUT_S) is not None
            # With nothing cached any more, the closed port is seen at once.
            assert _read_in_time(transports[kind], victim, kind, TIMEOUT_S) == "unreachable"
        victim.start()  # same agent name and ports, new cache addresses
        for kind in KINDS:
            _read_matches(transports[kind], victim, kind, local_cache, expected)
        # Killed and back again with no failed read in between: the cached connection is stale, and
        # still works.
        victim.kill()
        victim.start()
        for kind in KINDS:
            _read_matches(transports[kind], victim, kind, local_cache, expected)
    finally:
        victim.stop()


def _threads_cpu_s(tids: set[str]) -> float:
    """CPU seconds (user + system) that these threads of this process have used."""
    ticks = 0
    for tid in tids:
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def test_idle_nixl_agent_does_not_spin() -> None:
    """The agent's threads (its UCX progress thread above all) sleep between transfers; the progress
    thread once polled UCX without pause, a core per worker. Measured on the agent's own threads, so
    the rest of this process cannot fail it; ~2% of a core with the fix, a spinning thread gets far
    more than the bound even on a loaded 2-core box."""
    threads_before = set(os.listdir("/proc/self/task"))
    transport = make_transport("nixl", torch.zeros(LOCAL_SHAPE.dims(), dtype=torch.bfloat16),
                               f"kv-idle-{os.getpid()}", "127.0.0.1", free_port(),
                               registry=CollectorRegistry())
    try:
        agent_threads = set(os.listdir("/proc/self/task")) - threads_before
        start, cpu = time.monotonic(), _threads_cpu_s(agent_threads)
        time.sleep(2.0)
        share = (_threads_cpu_s(agent_threads) - cpu) / (time.monotonic() - start)
    finally:
        transport.close()
    assert agent_threads
    assert share < 0.3, f"idle NIXL agent threads used {share:.0%} of a core"


def test_bench_kv_transfer_smoke(tmp_path: Path) -> None:
    out = tmp_path / "kv.json"
    assert main(["bench", "kv-transfer", "--sizes", "1", "4", "--num-layers", "2", "--repeats", "2",
                 "--block-size", "4", "--output-json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {(r["transport"], r["blocks"])
            for r in doc["results"]} == {(k, n)
                                         for k in KINDS
                                         for n in (1, 4)}
    assert all(r["verified"] and r["p50_ms"] > 0 for r in doc["results"])
    assert doc["notified"] == {"nixl": 6, "grpc": 6}


def test_bench_kv_transfer_llama_8b_layout_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "kv8b.json"
    assert main([
        "bench", "kv-transfer", "--device", "cpu", "--layout", "llama-8b", "--sizes", "2",
        "--repeats", "1", "--blocks", "consecutive", "--transports", "nixl", "--output-json",
        str(out)
    ]) == 0
    doc = json.loads(out.read_text())
    assert doc["block_nbytes"] == 2 * 16 * 8 * 128 * 2  # one (layer, block) of Llama-3.1-8B: 64 KiB
    (row,) = doc["results"]
    assert row["verified"] and row["bytes"] == 2 * 32 * doc["block_nbytes"]  # 32 layers


def test_bench_kv_transfer_head_slices_in_both_orders(tmp_path: Path) -> None:
    """Decode rank 0 of TP=2 reading its 2 of 4 KV heads from TP=1: verified in both orders, HND
    in block_size (4) times fewer pieces."""
    out = tmp_path / "tp.json"
    assert main(["bench", "kv-transfer", "--sizes", "3", "--num-layers", "2", "--repeats", "1",
                 "--block-size", "4", "--kv-heads", "4", "--head-dim", "16", "--tp", "1:2",
                 "--kv-cache-layout", "NHD", "HND", "--output-json", str(out)]) == 0
    rows = {r["order"]: r for r in json.loads(out.read_text())["results"]}
    assert all(r["verified"] for r in rows.values())
    assert rows["NHD"]["bytes"] == rows["HND"]["bytes"] == 2 * 3 * 2 * 4 * 2 * 16 * 2
    assert rows["NHD"]["pieces"] == 2 * 3 * 2 * 4 and rows["HND"]["pieces"] == 2 * 3 * 2


def test_bench_kv_transfer_counts_pieces_without_moving(capsys: pytest.CaptureFixture[str]) -> None:
    """TP 4 -> 8 of a 70B at 8k tokens: 1.3 M pieces of 256 bytes per decode rank token-major,
    16 times fewer head-major."""
    assert main(["bench", "kv-transfer", "--layout", "llama-70b", "--tp", "4:8", "--count-only",
                 "8192"]) == 0
    out = capsys.readouterr().out
    assert "prefill NHD -> decode NHD:    1,310,720 pieces,      256 bytes" in out
    assert "prefill HND -> decode HND:       81,920 pieces,    4,096 bytes" in out


@pytest.mark.parametrize("argv, message", [
    (["--transports", "cuda_ipc"], "cuda_ipc transport needs --device cuda"),
    (["--tp", "2:4", "--transports", "grpc"], "reads head slices over nixl only"),
    pytest.param(["--device", "cuda"], "needs a CUDA device", marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="this machine has a GPU")),
])
def test_bench_kv_transfer_refuses_what_the_machine_cannot_do(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "kv-transfer", "--sizes", "1", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_pick_blocks_patterns() -> None:
    remote, local = pick_blocks(Random(0), "consecutive", 5, 8, 6)
    assert remote == list(range(remote[0], remote[0] + 5)) and remote[-1] < 8
    assert local == list(range(local[0], local[0] + 5)) and local[-1] < 6
    remote, local = pick_blocks(Random(0), "random", 5, 8, 6)
    assert len(set(remote)) == len(set(local)) == 5 and max(remote) < 8 and max(local) < 6
