"""Block copies between two byte views of caches ([layers, blocks, block_nbytes], layout.byte_view)
on devices, for whatever can address both caches directly (the CUDA IPC transport): a slice copy per
run of consecutive blocks when there are few runs, else a gather + scatter of the scattered blocks,
chunked so the staging tensor stays small on a shared GPU."""
from __future__ import annotations

import torch

from baton.services.engine.kv.layout import block_runs

# Up to this many runs, one strided copy per run beats index kernels (each copy moves every layer of
# its run).
MAX_RUN_COPIES = 8
# Staging bytes per gather + scatter chunk: 128 MiB is 64 blocks of the Llama-3.1-8B layout (32
# layers x 64 KiB).
CHUNK_BYTES = 128 << 20


def copy_blocks(dst: torch.Tensor, src: torch.Tensor, dst_blocks: list[int], src_blocks: list[int],
                max_run_copies: int = MAX_RUN_COPIES, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Copies every layer of src block `src_blocks[i]` into dst block `dst_blocks[i]` on the current
    stream. Returns the number of copy operations issued (runs, or gather + scatter chunks)."""
    runs = block_runs(src_blocks, dst_blocks)
    if len(runs) <= max_run_copies:
        for src_start, dst_start, n in runs:
            dst[:, dst_start:dst_start + n].copy_(src[:, src_start:src_start + n],
                                                  non_blocking=True)
        return len(runs)
    per_block = dst.shape[0] * dst.shape[2]
    step = max(1, chunk_bytes // per_block)
    issued = 0
    for i in range(0, len(src_blocks), step):
        src_idx = torch.tensor(src_blocks[i:i + step],
                               dtype=torch.int64).to(src.device, non_blocking=True)
        dst_idx = torch.tensor(dst_blocks[i:i + step],
                               dtype=torch.int64).to(dst.device, non_blocking=True)
        gathered = src.index_select(1, src_idx)
        dst.index_copy_(1, dst_idx, gathered.to(dst.device, non_blocking=True))
        issued += 1
    return issued
