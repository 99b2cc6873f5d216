"""Work rank 0 asks of the other ranks besides the model's steps, and their answers.

A task is a picklable object sent on the same channel as the steps (channel.py); the layer that
needs it defines it (the worker's KV transfer: one NIXL agent per rank, and each rank's share of a
cross-TP KV read), so the engine carries it without knowing what it does. A rank runs an inline task
between two steps, and any other on a thread of its own, so a slow KV read never holds up a step;
its answer goes back up the same socket, where rank 0's watcher (executor.py) files it by task id.
"""
from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch


class RankTaskFailed(RuntimeError):
    """A rank raised while running a task, or (timed_out) did not answer in time."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


@dataclass
class RankContext:
    """What a task may use on the rank that runs it; `state` keeps what tasks build for later ones
    (a rank's KV transport)."""
    rank: int
    size: int
    kv_cache: torch.Tensor
    config: Any  # the model's PretrainedConfig
    node_host: str | None = None  # RankSpec.node_host
    state: dict[str, Any] = field(default_factory=dict)


class RankTask(ABC):
    """Work for every rank other than 0. `task_id` is set by rank 0's executor when it is sent."""

    inline: bool = True  # run between steps; False: on a thread of the rank's own
    task_id: int = 0

    @abstractmethod
    def run(self, ctx: RankContext) -> Any:
        """This rank's answer (picklable); raising sends the error's text back instead."""


@dataclass(frozen=True)
class RankReply:
    task_id: int
    rank: int
    value: Any = None
    error: str | None = None


class Replies:
    """Rank 0's mailbox of the answers to tasks in flight, filled by the executor's watcher."""

    def __init__(self) -> None:
        self._by_task: dict[int, dict[int, RankReply]] = {}
        self._cond = threading.Condition()

    def expect(self, task_id: int) -> None:
        with self._cond:
            self._by_task[task_id] = {}

    def file(self, reply: RankReply) -> None:
        with self._cond:
            if reply.task_id in self._by_task:  # one given up on is dropped
                self._by_task[reply.task_id][reply.rank] = reply
                self._cond.notify_all()

    def wait(self, task_id: int, ranks: int, timeout_s: float) -> list[Any]:
        """Every rank's value, in rank order (1, 2, ...); raises RankTaskFailed naming the first
        rank that failed, or those that did not answer in time."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            try:
                while len(got := self._by_task[task_id]) < ranks:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        missing = sorted(set(range(1, ranks + 1)) - set(got))
                        raise RankTaskFailed(f"ranks {missing} did not answer in {timeout_s:g} s",
                                             timed_out=True)
                    self._cond.wait(left)
            finally:
                got = self._by_task.pop(task_id)
        failed = [r for r in sorted(got.values(), key=lambda r: r.rank) if r.error is not None]
        if failed:
            raise RankTaskFailed(f"rank {failed[0].rank}: {failed[0].error}")
        return [got[r].value for r in sorted(got)]
