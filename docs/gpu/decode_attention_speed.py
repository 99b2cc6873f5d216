"""Paged decode attention alone on the 8B layout (32 query heads, 8 KV heads, head_dim 128, bf16,
16-token blocks, shuffled block ids): time per call and the KV bytes it reads per second, with one
program per (sequence, KV head) and with the context split to fill the device; with the cache
token-major (NHD) and head-major (HND, --kv-cache-layout HND: a strided view of [blocks, 2,
KV heads, block, dim] storage).

Usage (on a GPU): python3 docs/gpu/decode_attention_speed.py [OUT.json]
"""
import json
import sys

import torch

from baton.kernels.paged_decode_attention import paged_decode_attention

HEADS, KV_HEADS, DIM, BLOCK, CONTEXT = 32, 8, 128, 16, 2048


def time_call(fn, repeats: int = 50) -> float:
    """Median milliseconds of fn over repeats, after a warm-up that compiles."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    rows = []
    for batch in (1, 8, 32, 128):
        blocks_per_seq = CONTEXT // BLOCK
        hnd = torch.randn(batch * blocks_per_seq + 1, 2, KV_HEADS, BLOCK, DIM, device="cuda",
                          dtype=torch.bfloat16)
        caches = {"NHD": hnd.transpose(2, 3).contiguous(), "HND": hnd.transpose(2, 3)}
        table = torch.randperm(batch * blocks_per_seq, device="cuda", dtype=torch.int64)
        table = table.view(batch, blocks_per_seq).to(torch.int32)
        lens = torch.full((batch,), CONTEXT, dtype=torch.int32, device="cuda")
        query = torch.randn(batch, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
        kv_bytes = batch * CONTEXT * 2 * KV_HEADS * DIM * 2
        for (order, cache), splits in ((c, s) for c in caches.items() for s in (1, None)):
            ms = time_call(lambda: paged_decode_attention(query, cache, table, lens, DIM**-0.5,
                                                          num_splits=splits))
            row = {"batch": batch, "layout": order, "splits": splits or "auto",
                   "ms": round(ms, 4), "kv_gb_per_s": round(kv_bytes / ms / 1e6, 1)}
            rows.append(row)
            print(row, flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "context": CONTEXT, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
