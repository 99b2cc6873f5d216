"""The capture agreement test's work, which rank 1 of a TP=2 engine runs as a rank task while the
test runs it on rank 0: both ranks capture with a stand-in that runs one all-reduce (as the warm-up
forward passes before each capture do), on clocks of their own."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from baton.services.engine.cuda_graphs import bucket_sizes, capture_in_lockstep
from baton.services.engine.parallel.rank_tasks import RankContext, RankTask
from baton.services.engine.parallel.state import get_tp_group

TIME_LIMIT_S = 25.0


def slow_clock(step_s: float) -> Callable[[], float]:
    """A clock that advances step_s at every reading: a rank whose captures take that long."""
    ticks = iter(range(1 << 20))
    return lambda: next(ticks) * step_s


def capture(step_s: float, device: torch.device) -> tuple[list[int], list[float]]:
    """The buckets of a batch of 40 this rank keeps, and what each all-reduce summed."""
    sums: list[float] = []

    def capture_one(bucket: int) -> int:
        sums.append(get_tp_group().all_reduce(torch.ones(1, device=device)).item())
        return bucket

    steps = capture_in_lockstep(list(reversed(bucket_sizes(40))), capture_one, TIME_LIMIT_S,
                                slow_clock(step_s))
    return sorted(steps), sums


@dataclass
class CaptureTask(RankTask):
    step_s: float

    def run(self, ctx: RankContext) -> tuple[list[int], list[float]]:
        return capture(self.step_s, ctx.kv_cache.device)
