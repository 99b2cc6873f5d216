"""This process's place in its tensor-parallel group: rank, world size and the process groups the
model's collectives and the control messages run on.

One group per process, set once before the model is built (the layers read it when they are
constructed, as vLLM's do); a process that never joins one is rank 0 of 1, and every collective is
then a no-op, so TP=1 runs exactly the single-process arithmetic.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass
class CollectiveClock:
    """Wall time this process spent in the model's collectives (waiting for the slowest rank
    included), for `baton bench tp`. On GPU it counts only the launches, NCCL being
    asynchronous."""
    seconds: float = 0.0
    calls: int = 0

    @contextmanager
    def timed(self) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - started
            self.calls += 1


COLLECTIVES = CollectiveClock()


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    # The model's collectives: NCCL on GPU, gloo on CPU.
    group: Any = None
    # Small host-side exchanges (block counts, loaded bytes): always gloo.
    cpu_group: Any = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sums x over the ranks, in place."""
        if self.size > 1:
            with COLLECTIVES.timed():
                dist.all_reduce(x, group=self.group)
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor | None:
        """Rank 0 gets every rank's x concatenated along the last dimension (rank order); the
        others get None. Every rank's x must have the same shape."""
        if self.size == 1:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)] if self.rank == 0 else None
        with COLLECTIVES.timed():
            dist.gather(x, parts, dst=0, group=self.group)
        return torch.cat(parts, dim=-1) if parts is not None else None

    def min_int(self, value: int) -> int:
        """The smallest of every rank's value."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def all_gather_object(self, value: Any) -> list[Any]:
        if self.size == 1:
            return [value]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, value, group=self.cpu_group)
        return out


_GROUP = TPGroup()


def get_tp_group() -> TPGroup:
    return _GROUP


@contextmanager
def solo() -> Iterator[None]:
    """Builds what is made inside it as a group of one: its layers keep the whole model and join
    no collective (a draft model that rank 0 runs alone beside its shard of the target)."""
    global _GROUP
    saved, _GROUP = _GROUP, TPGroup()
    try:
        yield
    finally:
        _GROUP = saved


def init_tp(rank: int, size: int, init_method: str, device: torch.device,
            timeout_s: float) -> TPGroup:
    """Joins the group; every collective after this fails after timeout_s instead of waiting for
    a dead rank forever."""
    global _GROUP
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                            timeout=timedelta(seconds=timeout_s))
    group = dist.group.WORLD
    cpu_group = group if backend == "gloo" else dist.new_group(
        backend="gloo", timeout=timedelta(seconds=timeout_s))
    _GROUP = TPGroup(rank, size, group, cpu_group)
    log.info("tensor-parallel rank %d of %d joined (%s)", rank, size, backend)
    return _GROUP


def destroy_tp() -> None:
    global _GROUP
    if _GROUP.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
    _GROUP = TPGroup()
