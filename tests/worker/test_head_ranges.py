"""The KV hand-off across tensor-parallel sizes, without processes: which prefill rank and head
slice each decode rank reads, for KV heads that split and that are replicated, over TP 1/2/4
pairs; the address tables of a head-slice read, applied as plain copies, land exactly the heads
torch's slicing gives, between any pair of in-block orders (NHD, HND), HND in block_size times
fewer pieces; sizes that cannot hand off are refused in one line, by `baton serve` too."""
from __future__ import annotations

import logging

import pytest
import torch

from baton.services.cli.main import main
from baton.services.engine.kv.layout import KVLayout, storage
from baton.services.worker.kv_transfer.descriptors import HeadSlice, head_slice_tables
from baton.services.worker.kv_transfer.head_ranges import (HeadRange, HeadRead, TPMismatch,
                                                           plan_reads, rank_heads)

HEADS = 8  # query heads, so TP 1, 2 and 4 all split them


def _plan(kv_heads: int, prefill_tp: int, decode_tp: int) -> list[list[HeadRead]]:
    prefill = [rank_heads(HEADS, kv_heads, r, prefill_tp) for r in range(prefill_tp)]
    return [plan_reads(prefill, rank_heads(HEADS, kv_heads, d, decode_tp), decode_tp)
            for d in range(decode_tp)]


def test_rank_heads_split_and_replicated():
    assert [rank_heads(HEADS, 4, r, 2) for r in range(2)] == [HeadRange(0, 2), HeadRange(2, 2)]
    # 2 KV heads over 4 ranks: ranks 0 and 1 share head 0, ranks 2 and 3 head 1.
    assert [rank_heads(HEADS, 2, r, 4) for r in range(4)] == [
        HeadRange(0, 1), HeadRange(0, 1), HeadRange(1, 1), HeadRange(1, 1)]


@pytest.mark.parametrize("kv_heads, prefill_tp, decode_tp, expected", [
    # same sizes: each decode rank reads its twin's whole cache
    (4, 2, 2, [[HeadRead(0, 0, 0, 2)], [HeadRead(1, 0, 0, 2)]]),
    # split at 2 -> 1: the one decode rank reads both halves
    (4, 2, 1, [[HeadRead(0, 0, 0, 2), HeadRead(1, 0, 2, 2)]]),
    # split at 1 -> 2: each decode rank reads its half of the one prefill rank
    (4, 1, 2, [[HeadRead(0, 0, 0, 2)], [HeadRead(0, 2, 0, 2)]]),
    # split at 4 -> 2: each decode rank reads two prefill ranks' single heads
    (4, 4, 2, [[HeadRead(0, 0, 0, 1), HeadRead(1, 0, 1, 1)],
               [HeadRead(2, 0, 0, 1), HeadRead(3, 0, 1, 1)]]),
    # replicated at 4 (2 KV heads) -> 1: head 0 from rank 0, head 1 from rank 2 (its first holder)
    (2, 4, 1, [[HeadRead(0, 0, 0, 1), HeadRead(2, 0, 1, 1)]]),
    # 1 -> replicated at 4: ranks 0, 1 read head 0; ranks 2, 3 head 1
    (2, 1, 4, [[HeadRead(0, 0, 0, 1)], [HeadRead(0, 0, 0, 1)], [HeadRead(0, 1, 0, 1)],
               [HeadRead(0, 1, 0, 1)]]),
    # split at 2 (2 KV heads) -> replicated at 4
    (2, 2, 4, [[HeadRead(0, 0, 0, 1)], [HeadRead(0, 0, 0, 1)], [HeadRead(1, 0, 0, 1)],
               [HeadRead(1, 0, 0, 1)]]),
    # one KV head (MQA), replicated everywhere: every rank reads prefill rank 0's head
    (1, 4, 2, [[HeadRead(0, 0, 0, 1)], [HeadRead(0, 0, 0, 1)]]),
])
def test_plan_reads(kv_heads, prefill_tp, decode_tp, expected):
    assert _plan(kv_heads, prefill_tp, decode_tp) == expected


def test_sizes_that_do_not_divide_are_refused():
    with pytest.raises(TPMismatch, match="at --tensor-parallel-size 2 cannot hand its KV to a "
                                         "decode pool at 3"):
        _plan(6, 2, 3)


def _cache(blocks: int, heads: int, order: str, fill: bool) -> torch.Tensor:
    """[layers, blocks, K/V, block_size, heads, head_dim] in `order` (kv_cache.allocate's)."""
    make = torch.randn if fill else torch.zeros
    if order == "HND":
        return make(2, blocks, 2, heads, 4, 3).transpose(3, 4)
    return make(2, blocks, 2, 4, heads, 3)


def _apply(tables: tuple, local: torch.Tensor, remote: torch.Tensor) -> None:
    """The address tables as byte copies between the two caches' memory."""
    local_table, remote_table = tables
    assert local_table.shape == remote_table.shape
    src, dst = storage(remote).view(torch.uint8).view(-1), storage(local).view(torch.uint8).view(-1)
    for (l_addr, length, _), (r_addr, r_length, _) in zip(local_table.tolist(),
                                                          remote_table.tolist()):
        assert length == r_length
        lo, ro = l_addr - local.data_ptr(), r_addr - remote.data_ptr()
        dst[lo:lo + length] = src[ro:ro + length]


@pytest.mark.parametrize("local_order, remote_order, pieces", [
    ("NHD", "NHD", 2 * 2 * 2 * 4),  # (layer, block, K/V, token)
    ("HND", "HND", 2 * 2 * 2),  # (layer, block, K/V): the heads' tokens are one run
    ("HND", "NHD", 2 * 2 * 2 * 4 * 2),  # (layer, block, K/V, token, head)
    ("NHD", "HND", 2 * 2 * 2 * 4 * 2),
])
def test_head_slice_tables_copy_the_heads_torch_slices(local_order, remote_order, pieces):
    """Prefill at TP=1 (4 KV heads) to a decode rank holding heads 2-3, in each pair of cache
    orders: the tables, applied as copies between the two caches' bytes, give what slicing the
    heads gives."""
    remote, local = _cache(5, 4, remote_order, True), _cache(6, 2, local_order, False)
    remote_blocks, local_blocks = [4, 1], [0, 5]
    tables = head_slice_tables(KVLayout.of(local), KVLayout.of(remote), remote_blocks,
                               local_blocks, HeadSlice(2, 0, 2, 4, 2), 0, 0)
    assert tables[0].shape[0] == pieces
    _apply(tables, local, remote)
    for r, l in zip(remote_blocks, local_blocks):
        assert torch.equal(local[:, l], remote[:, r, :, :, 2:4])
    untouched = [b for b in range(6) if b not in local_blocks]
    assert not local[:, untouched].any()


@pytest.mark.parametrize("local_order, remote_order", [("HND", "NHD"), ("NHD", "HND")])
def test_whole_blocks_across_orders_land_transposed(local_order, remote_order):
    """Equal TP sizes but different orders: every head, in pieces both orders hold, lands as the
    same logical values."""
    remote, local = _cache(3, 2, remote_order, True), _cache(3, 2, local_order, False)
    tables = head_slice_tables(KVLayout.of(local), KVLayout.of(remote), [2, 0], [1, 2],
                               HeadSlice(0, 0, 2, 2, 2), 0, 0)
    _apply(tables, local, remote)
    assert torch.equal(local[:, [1, 2]], remote[:, [2, 0]])


def _pieces(order: str, prefill_tp: int, decode_tp: int) -> int:
    """Pieces decode rank 0 reads of a 64-block hand-off of a 32-layer model with 8 KV heads."""
    reads = _plan(8, prefill_tp, decode_tp)[0]
    heads = (8 // prefill_tp, 8 // decode_tp)
    layouts = [KVLayout(32, 100, 16, 2 * 16 * n * 128 * 2, 1 << 30, "bfloat16", order)
               for n in heads]
    blocks = list(range(64))
    return sum(head_slice_tables(layouts[1], layouts[0], blocks, blocks,
                                 HeadSlice(r.src, r.dst, r.count, *heads), 0, 0)[0].shape[0]
               for r in reads)


def test_hnd_reads_block_size_times_fewer_pieces_across_tp():
    assert _pieces("NHD", 4, 8) == 32 * 64 * 2 * 16
    assert _pieces("HND", 4, 8) == 32 * 64 * 2
    assert _pieces("NHD", 8, 4) == 16 * _pieces("HND", 8, 4)


def test_serve_refuses_pools_whose_sizes_do_not_divide(caplog):
    caplog.set_level(logging.ERROR)
    assert main(["serve", "--prefill-worker-arg=-tp=2", "--decode-worker-arg=-tp=3"]) == 2
    assert "cannot hand its KV to a decode pool at 3" in caplog.text
