"""Shared by the graph tests: a spy on a graph set's runs, a follower runner that mirrors rank 0's
step messages in process, and the capture agreement test's work, which rank 1 of a TP=2 engine runs
as a rank task while the test runs it on rank 0: both ranks capture with a stand-in that runs one
all-reduce (as the warm-up forward passes before each capture do), on clocks of their own."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from baton.services.engine.cuda_graphs import bucket_sizes, capture_in_lockstep
from baton.services.engine.parallel.rank_tasks import RankContext, RankTask
from baton.services.engine.parallel.state import get_tp_group
from baton.services.engine.parallel.step_sync import StepDecoder

TIME_LIMIT_S = 25.0


def spy_runs(graphs: Any) -> list[tuple[Any, int | None]]:
    """Records the (batch, bucket) of every run call of a graph set (bucket None: the smallest
    that fits)."""
    seen, run = [], graphs.run

    def spy(batch: Any, bucket: int | None = None) -> Any:
        seen.append((batch, bucket))
        return run(batch, bucket)

    graphs.run = spy
    return seen


class StepMirror:
    """Stands in for rank 0's executor: each step message goes to a second runner's
    execute_follower, as a follower rank's loop hands it over."""

    def __init__(self, follower: Any) -> None:
        self.follower, self.decoder, self.messages = follower, StepDecoder(), []

    def send(self, message: Any) -> None:
        self.messages.append(message)
        self.follower.execute_follower(self.decoder.decode(message), message.score_rows,
                                       message.bucket)

    def close(self) -> None:
        pass


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
