"""Host-tier KV bandwidth on a GPU (issue 32's target: host-to-device loads >= 20 GB/s).

Runs the engine's own TierManager on an 8B-shaped CUDA cache (32 layers, 8 KV heads of 128, bf16,
16-token blocks: 2 MiB a block): stores 2k-token prompts' blocks to the pinned host tier, loads
them back into other device blocks, checks the bytes, and times both directions as the copier
counts them. A plain pinned-to-device copy of the same bytes is printed beside them as the bus's
ceiling. Usage: python3 docs/gpu/tier_load_speed.py OUT.json
"""
from __future__ import annotations

import json
import sys
import time

import torch

from baton.services.engine.kv.tiers.manager import TierManager

LAYERS, BLOCKS, BLOCK, HEADS, DIM = 32, 640, 16, 8, 128
PROMPT_BLOCKS = 128  # 2,048 tokens
REPEATS = 5


def main(out_path: str) -> None:
    cache = torch.randn(LAYERS, BLOCKS, 2, BLOCK, HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    tiers = TierManager(cache, host_gib=4.0)
    results: dict[str, object] = {"gpu": torch.cuda.get_device_name(), "prompt_tokens": 2048}
    loads, stores = [], []
    for r in range(REPEATS):
        src = list(range(r * PROMPT_BLOCKS % 256, r * PROMPT_BLOCKS % 256 + PROMPT_BLOCKS))
        hashes = [10_000 * (r + 1) + i for i in range(PROMPT_BLOCKS)]
        before = tiers.stats["host"].seconds_stored
        for block, h in zip(src, hashes):
            tiers.store(block, h)
        assert tiers.flush(), "stores did not finish"
        stores.append(tiers.stats["host"].seconds_stored - before)
        dst = list(range(384, 384 + PROMPT_BLOCKS))
        cache[:, dst] = 0
        torch.cuda.synchronize()
        hits = tiers.lookup(hashes)
        assert len(hits) == PROMPT_BLOCKS
        before = tiers.stats["host"].seconds_loaded
        started = time.perf_counter()
        job = tiers.load(hits, dst)
        tiers.wait(job)
        wall = time.perf_counter() - started
        loads.append((tiers.stats["host"].seconds_loaded - before, wall))
        assert job.loaded == PROMPT_BLOCKS
        assert torch.equal(cache[:, dst], cache[:, src]), "loaded blocks differ from the stored"
    nbytes = PROMPT_BLOCKS * tiers.host.block_bytes
    results["bytes_per_prompt"] = nbytes
    results["load_gbps"] = [round(nbytes / s / 1e9, 2) for s, _ in loads]
    results["load_wall_ms"] = [round(w * 1e3, 2) for _, w in loads]
    results["store_gbps"] = [round(nbytes / s / 1e9, 2) for s in stores]
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(REPEATS):
        torch.cuda.synchronize()
        started = time.perf_counter()
        device.copy_(pinned, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    results["pinned_h2d_gbps"] = round(nbytes / min(times) / 1e9, 2)
    tiers.close()
    print(json.dumps(results))
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
