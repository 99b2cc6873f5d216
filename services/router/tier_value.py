"""What a prompt block in a worker's KV tier is worth, against one in its device cache, from
measured costs rather than a set constant.

A device-cache hit costs the worker nothing; a miss costs it the prefill of block_size tokens,
block_size / r seconds, r being the prefill rate the TTFT predictor uses for that worker (its own
measurement, else what the router learned). A tier hit costs the tier's measured load time per
block, L (the worker's mean over its loads; before any, over its stores of the same bytes). So a
tier block saves block_size / r - L of a miss's block_size / r, and counts as the fraction

    w = clamp(1 - L * r / block_size, 0, 1)

of a device-cached block: a host hit scores below a device hit (L > 0) and above a miss while
loading beats recomputing (L < block_size / r). A tier the worker has measured nothing for
(L = 0 reported) is worth nothing yet: an unmeasured cost is not guessed.
"""
from __future__ import annotations

from collections.abc import Mapping

from baton.services.router.prefix_index import TierRun
from baton.services.router.ttft_predictor import TTFTPredictor
from baton.services.router.worker_state import WorkerState


def tier_weight(load_s_per_block: float, tokens_per_s: float, block_size: int) -> float:
    """w above: the share of a device hit's worth that one block in the tier has."""
    if load_s_per_block <= 0 or tokens_per_s <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - load_s_per_block * tokens_per_s / block_size))


def tier_blocks(runs: Mapping[str, TierRun], workers: Mapping[str, WorkerState],
                predictor: TTFTPredictor, block_size: int) -> dict[str, float]:
    """Per worker with a tier run: its blocks, each weighted by w, as device-cached blocks."""
    value: dict[str, float] = {}
    for worker_id, run in runs.items():
        worker = workers.get(worker_id)
        report = worker.report if worker is not None else None
        if report is None:
            continue
        rate = predictor.tokens_per_s(worker_id)
        worth = (run.host * tier_weight(report.host_load_seconds_per_block, rate, block_size)
                 + run.disk * tier_weight(report.disk_load_seconds_per_block, rate, block_size))
        if worth > 0:
            value[worker_id] = worth
    return value
