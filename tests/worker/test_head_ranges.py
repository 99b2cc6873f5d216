"""The KV hand-off across tensor-parallel sizes, without processes: which prefill rank and head
slice each decode rank reads, for KV heads that split and that are replicated, over TP 1/2/4
pairs; the address tables of a head-slice read, applied as plain copies, land exactly the heads
torch's slicing gives; sizes that cannot hand off are refused in one line, by `baton serve` too."""
from __future__ import annotations

import logging

import pytest
import torch

from baton.services.cli.main import main
from baton.services.engine.kv.layout import KVLayout
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


def _layout(cache: torch.Tensor) -> KVLayout:
    return KVLayout.of(cache)


def test_head_slice_tables_copy_the_heads_torch_slices():
    """Prefill at TP=1 (4 KV heads) to a decode rank holding heads 2-3: the tables, applied as
    copies between the two caches' bytes, give what slicing the heads gives."""
    remote = torch.randn(2, 5, 2, 4, 4, 3)  # [layers, blocks, K/V, block_size, heads, head_dim]
    local = torch.zeros(2, 6, 2, 4, 2, 3)
    remote_blocks, local_blocks = [4, 1], [0, 5]
    local_table, remote_table = head_slice_tables(
        _layout(local), _layout(remote), remote_blocks, local_blocks, HeadSlice(2, 0, 2, 4, 2), 0,
        0)
    assert local_table.shape == remote_table.shape == (2 * 2 * 2 * 4, 3)
    src = remote.view(torch.uint8).view(-1)
    dst = local.view(torch.uint8).view(-1)
    for (l_addr, length, _), (r_addr, r_length, _) in zip(local_table.tolist(),
                                                          remote_table.tolist()):
        assert length == r_length == 2 * 3 * 4
        lo, ro = l_addr - local.data_ptr(), r_addr - remote.data_ptr()
        dst[lo:lo + length] = src[ro:ro + length]
    for r, l in zip(remote_blocks, local_blocks):
        assert torch.equal(local[:, l], remote[:, r, :, :, 2:4])
    untouched = [b for b in range(6) if b not in local_blocks]
    assert not local[:, untouched].any()


def test_serve_refuses_pools_whose_sizes_do_not_divide(caplog):
    caplog.set_level(logging.ERROR)
    assert main(["serve", "--prefill-worker-arg=-tp=2", "--decode-worker-arg=-tp=3"]) == 2
    assert "cannot hand its KV to a decode pool at 3" in caplog.text
