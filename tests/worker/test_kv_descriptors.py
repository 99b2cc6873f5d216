"""Coalescing of block runs into ranges, the device block copy (on CPU tensors, token- and
head-major), whole-block reads refused across orders, and how NIXL is found and UCX set up for GPU
memory; no second process needed."""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from baton.services.engine.kv.block_copy import copy_blocks
from baton.services.engine.kv.layout import KVLayout, block_runs, byte_view, order_of, storage
from baton.services.worker.kv_transfer.base import KVPeer, KVTransferError, check_read
from baton.services.worker.kv_transfer import nixl_loader
from baton.services.worker.kv_transfer.descriptors import coalesced_tables, run_table
from baton.services.worker.kv_transfer.nixl_transport import descriptor_table

LAYOUT = KVLayout(num_layers=3, num_blocks=10, block_size=4, block_nbytes=256, base_address=1 << 20,
                  dtype="bfloat16")
REMOTE = KVLayout(num_layers=3, num_blocks=12, block_size=4, block_nbytes=256, base_address=7 << 30,
                  dtype="bfloat16")


@pytest.mark.parametrize("remote,local,runs", [
    ([], [], []),
    ([5], [2], [(5, 2, 1)]),
    ([0, 1, 2, 3], [4, 5, 6, 7], [(0, 4, 4)]),
    ([0, 1, 2, 7, 8], [4, 5, 6, 0, 1], [(0, 4, 3), (7, 0, 2)]),
    # consecutive remotely, not locally: split where local breaks
    ([0, 1, 2], [4, 6, 7], [(0, 4, 1), (1, 6, 2)]),
    ([3, 2, 1], [0, 1, 2], [(3, 0, 1), (2, 1, 1), (1, 2, 1)]),  # descending never merges
])
def test_block_runs(remote: list[int], local: list[int], runs: list[tuple[int, int, int]]) -> None:
    assert block_runs(remote, local) == runs


def test_run_table_addresses_span_each_run_in_every_layer() -> None:
    table = run_table(LAYOUT, [0, 7], [3, 2], device_id=1)
    stride = LAYOUT.num_blocks * LAYOUT.block_nbytes
    expected = []
    for layer in range(3):
        expected.append((LAYOUT.base_address + layer * stride + 0, 3 * 256, 1))
        expected.append((LAYOUT.base_address + layer * stride + 7 * 256, 2 * 256, 1))
    assert [tuple(int(x) for x in row) for row in table] == expected


def test_run_table_of_single_blocks_matches_the_prepared_descriptor_rows() -> None:
    blocks = [9, 2, 5]
    table = run_table(LAYOUT, blocks, [1, 1, 1], device_id=0)
    full = descriptor_table(LAYOUT, 0)
    rows = [layer * LAYOUT.num_blocks + b for layer in range(3) for b in blocks]
    np.testing.assert_array_equal(table, full[rows])


def test_coalesced_tables_merge_a_prompt_into_one_range_per_layer() -> None:
    local, remote = coalesced_tables(LAYOUT, REMOTE, list(range(2, 10)), list(range(0, 8)), 0, 0)
    assert local.shape == remote.shape == (3, 3)  # 8 blocks x 3 layers = 24 ranges became 3
    assert (local[:, 1] == 8 * 256).all() and (remote[:, 1] == 8 * 256).all()
    assert int(remote[1, 0]) == REMOTE.base_address + (1 * REMOTE.num_blocks + 2) * 256
    assert int(local[2, 0]) == LAYOUT.base_address + (2 * LAYOUT.num_blocks + 0) * 256
    # Both sides always describe the same byte count, range by range.
    np.testing.assert_array_equal(local[:, 1], remote[:, 1])


def test_coalesced_tables_leave_scattered_blocks_to_the_prepared_lists() -> None:
    assert coalesced_tables(LAYOUT, REMOTE, [9, 2, 5], [0, 6, 3], 0, 0) is None


def _caches() -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(0, 256, (3, 12, 64), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(3))
    return src, torch.zeros((3, 10, 64), dtype=torch.uint8)


@pytest.mark.parametrize("src_blocks,dst_blocks,max_runs,chunk,issued", [
    ([2, 3, 4, 5], [6, 7, 8, 9], 8, 1 << 20, 1),  # one run: one strided copy
    ([11, 0, 5, 6], [0, 9, 2, 3], 8, 1 << 20, 3),  # three runs, still slice copies
    ([11, 0, 5, 6, 1], [0, 9, 2, 3, 5], 1, 1 << 20, 1),  # gather + scatter, one chunk
    ([11, 0, 5, 6, 1], [0, 9, 2, 3, 5], 1, 2 * 3 * 64, 3),  # chunks of two blocks: 2 + 2 + 1
])
def test_copy_blocks_moves_every_layer_of_each_block(src_blocks: list[int], dst_blocks: list[int],
                                                     max_runs: int, chunk: int,
                                                     issued: int) -> None:
    src, dst = _caches()
    assert copy_blocks(dst, src, dst_blocks, src_blocks, max_runs, chunk) == issued
    for s, d in zip(src_blocks, dst_blocks):
        assert torch.equal(dst[:, d], src[:, s])
    untouched = [b for b in range(10) if b not in dst_blocks]
    assert not dst[:, untouched].any()


def test_hnd_byte_view_is_its_storage_and_copies_blocks_whole() -> None:
    """An HND cache's (layer, block) bytes are its head-major storage; whole-block copies between
    two HND caches move the same logical values."""
    src = torch.randn(3, 12, 2, 2, 4, 8).transpose(3, 4)  # [layers, blocks, K/V, tokens, heads, D]
    dst = torch.zeros(3, 10, 2, 2, 4, 8).transpose(3, 4)
    assert order_of(src) == "HND" and KVLayout.of(src).block_nbytes == 2 * 4 * 2 * 8 * 4
    assert torch.equal(byte_view(src)[1, 2].view(torch.float32), storage(src)[1, 2].flatten())
    copy_blocks(byte_view(dst), byte_view(src), [0, 7], [11, 3])
    assert torch.equal(dst[:, [0, 7]], src[:, [11, 3]])


def test_whole_block_reads_refuse_a_peer_of_the_other_order() -> None:
    peer = KVPeer("prefill", "127.0.0.1", 1, replace(REMOTE, order="HND"))
    with pytest.raises(KVTransferError, match="peer prefill's cache is HND but the local one is "
                                              "NHD: whole-block copies need one --kv-cache-layout"):
        check_read(LAYOUT, peer, [1], [2])


def _fake_packages(monkeypatch: pytest.MonkeyPatch, present: dict[str,
                                                                  BaseException | None]) -> None:
    """`present` maps a NIXL module name to the error importing its _api raises (None: it loads)."""
    real_find_spec, real_import = importlib.util.find_spec, importlib.import_module

    def find_spec(name: str, *args: object) -> object:
        if name in nixl_loader.NIXL_MODULES:
            return SimpleNamespace(submodule_search_locations=None) if name in present else None
        return real_find_spec(name, *args)

    def import_module(name: str, *args: object) -> object:
        package = name.removesuffix("._api")
        if package in nixl_loader.NIXL_MODULES:
            if present.get(package) is not None:
                raise present[package]
            return SimpleNamespace(nixl_agent=f"{package}-agent",
                                   nixl_agent_config=f"{package}-config")
        return real_import(name, *args)

    monkeypatch.setattr(nixl_loader.importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(nixl_loader.importlib, "import_module", import_module)


def _import_error_with_cause() -> ImportError:
    cause = OSError("libnixl.so: cannot open shared object file: No such file or directory")
    try:
        raise ImportError("cannot import name '_bindings' from 'nixl_cu13'") from cause
    except ImportError as e:
        return e


def test_load_nixl_names_the_real_cause_of_a_wheel_that_does_not_load(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_packages(monkeypatch, {"nixl_cu13": _import_error_with_cause()})
    with pytest.raises(ImportError) as info:
        nixl_loader.load_nixl()
    message = str(info.value)
    assert message.startswith("NIXL is installed but does not load")
    assert "nixl_cu13" in message and "_bindings" in message
    assert "libnixl.so: cannot open shared object file" in message


def test_load_nixl_says_how_to_install_when_nothing_is_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_packages(monkeypatch, {})
    with pytest.raises(
            ImportError,
            match=r"NIXL is not installed: pip install 'baton\[cu12\]' or 'baton\[cu13\]'"):
        nixl_loader.load_nixl()


def test_load_nixl_falls_through_a_broken_wheel_to_a_working_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_packages(monkeypatch, {"nixl_cu13": _import_error_with_cause(), "nixl_cu12": None})
    assert nixl_loader.load_nixl() == ("nixl_cu12-agent", "nixl_cu12-config")


@pytest.mark.parametrize("cuda, first", [("13.0", "nixl_cu13"), ("12.8", "nixl_cu12"),
                                         (None, "nixl_cu13"), ("11.8", "nixl_cu13")])
def test_search_order_puts_torchs_cuda_major_first(cuda: str | None, first: str) -> None:
    order = nixl_loader.search_order(cuda)
    assert order[0] == "nixl" and order[1] == first and sorted(order) == sorted(
        nixl_loader.NIXL_MODULES)


def test_configure_ucx_for_cuda_points_at_the_bundled_modules(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    (tmp_path / "nixl_cu13.libs" / "ucx").mkdir(parents=True)
    (tmp_path / "nixl_cu13").mkdir()
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        nixl_loader.importlib.util, "find_spec", lambda name, *a:
        (SimpleNamespace(submodule_search_locations=[str(tmp_path / "nixl_cu13")])
         if name == "nixl_cu13" else None
         if name in nixl_loader.NIXL_MODULES else real_find_spec(name, *a)))
    env: dict[str, str] = {}
    applied = nixl_loader.configure_ucx_for_cuda(environ=env)
    assert env == applied == {
        "UCX_MEMTYPE_CACHE": "n", "UCX_MODULE_DIR": str(tmp_path / "nixl_cu13.libs" / "ucx"),
        "UCX_TLS": nixl_loader.CUDA_UCX_TLS, "UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "y"
    }
    assert {"cuda_ipc", "cuda_copy", "tcp"} <= set(env["UCX_TLS"].split(","))


def test_configure_ucx_for_cuda_keeps_the_operators_settings_unless_told(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nixl_loader, "bundled_ucx_module_dir", lambda: None)
    env = {"UCX_TLS": "rc,cuda_copy,cuda_ipc,tcp", "UCX_MEMTYPE_CACHE": "y",
           "UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "n"}
    assert nixl_loader.configure_ucx_for_cuda(environ=env) == {}
    assert env["UCX_TLS"] == "rc,cuda_copy,cuda_ipc,tcp" and env["UCX_MEMTYPE_CACHE"] == "y"
    assert nixl_loader.configure_ucx_for_cuda("cuda_ipc,tcp,self",
                                              environ=env) == {"UCX_TLS": "cuda_ipc,tcp,self"}
