"""Starting the ranks other than 0 and watching them: one process each on this node
(MultiprocExecutor, spawned interpreters) or one Ray actor each (ray_executor.py).

Rank 0 is the engine's own process. It listens on a socket the other ranks connect to
(channel.py), then all join one torch.distributed group. A watcher thread reads those sockets: the
ranks write only the answers to rank tasks (rank_tasks.py), which it files; the end of a socket
means a rank is gone (crashed, OOM-killed, kill -9), and the process exits at once with
EXIT_RANK_LOST rather than wait in a collective that can never finish; what supervises the worker
(`baton serve`, Kubernetes) restarts it, and the gateway moves its streams to another worker as for
any dead worker.
"""
from __future__ import annotations

import itertools
import logging
import os
import pickle
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from baton.services.engine.config import EngineConfig
from baton.services.engine.parallel import channel
from baton.services.engine.parallel.rank_tasks import RankReply, RankTask, Replies
from baton.services.engine.parallel.state import destroy_tp, init_tp

log = logging.getLogger(__name__)

RANK_MODULE = "baton.services.engine.parallel.rank_worker"
# The worker's exit status when a rank is lost (EX_SOFTWARE).
EXIT_RANK_LOST = 70
# How long the other ranks may take to start and connect (imports, CUDA init) on a busy machine.
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RankSpec:
    """What a rank other than 0 needs to build its share of the engine."""
    rank: int
    size: int
    host: str  # rank 0's address: its channel and the torch.distributed rendezvous
    channel_port: int
    dist_port: int
    engine: EngineConfig
    model_dir: str
    dtype: torch.dtype
    device_type: str
    local_rank: int  # the device index on the rank's node
    max_model_len: int
    kv_blocks_wanted: int | None
    log_level: int = logging.INFO  # rank 0's
    # The address of this rank's own node when it may not be rank 0's (a Ray actor), for what it
    # serves to other workers (its NIXL agent); None: rank 0's node, whose worker address is used.
    node_host: str | None = None

    @property
    def init_method(self) -> str:
        return f"tcp://{self.host}:{self.dist_port}"


def set_cpu_threads(engine: EngineConfig, device_type: str) -> None:
    """On a CPU, num_threads or else an equal share of the cores per rank: torch's default of
    every core in every rank's process would oversubscribe them N times."""
    if device_type == "cpu":
        torch.set_num_threads(engine.num_threads or
                              max(1, (os.cpu_count() or 1) // engine.tensor_parallel_size))


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Executor:
    """The ranks other than 0, started by a subclass's _start_ranks."""

    backend = "base"

    def __init__(self, engine: EngineConfig, model_dir: str, dtype: torch.dtype,
                 device: torch.device, max_model_len: int, kv_blocks_wanted: int | None) -> None:
        self.size = engine.tensor_parallel_size
        self.host = self._host()
        self._server = channel.listen(self.host)
        self.spec = RankSpec(0, self.size, self.host, self._server.getsockname()[1],
                             free_port(self.host), engine, model_dir, dtype, device.type, 0,
                             max_model_len, kv_blocks_wanted,
                             logging.getLogger().getEffectiveLevel())
        self.conns: list[socket.socket] = []
        self._closing = False
        # Steps go out from the engine's thread; rank tasks and LoRA's decisions (a runtime
        # adapter load) may come from others: one frame at a time.
        self._send_lock = threading.Lock()
        self.replies = Replies()
        self._task_ids = itertools.count(1)

    def _host(self) -> str:
        return "127.0.0.1"

    def _start_ranks(self, specs: list[RankSpec]) -> None:
        raise NotImplementedError

    def _check_alive(self) -> None:
        """Raises when a rank died before connecting."""

    def start(self, device: torch.device) -> None:
        """Starts the other ranks, waits for each to connect, joins the group as rank 0."""
        specs = [replace(self.spec, rank=r, local_rank=self._local_rank(r))
                 for r in range(1, self.size)]
        self._start_ranks(specs)
        deadline = time.monotonic() + START_TIMEOUT_S
        by_rank: dict[int, socket.socket] = {}
        while len(by_rank) < self.size - 1:
            self._check_alive()
            if time.monotonic() > deadline:
                missing = sorted(set(range(1, self.size)) - set(by_rank))
                raise RuntimeError(f"tensor-parallel ranks {missing} did not connect in "
                                   f"{START_TIMEOUT_S:g} s")
            try:
                conn, rank = channel.accept(self._server, 1.0)
            except TimeoutError:
                continue
            by_rank[rank] = conn
        self.conns = [by_rank[r] for r in range(1, self.size)]
        threading.Thread(target=self._watch, name="tp-rank-watcher", daemon=True).start()
        init_tp(0, self.size, self.spec.init_method, device,
                self.spec.engine.distributed_timeout_seconds)

    def _local_rank(self, rank: int) -> int:
        return rank

    def send(self, message: Any) -> None:
        with self._send_lock:
            channel.send(self.conns, message)

    def post(self, task: RankTask | Any) -> int:
        """Sends a task to every other rank; returns its id, for `wait`. Besides a RankTask, any
        message with a task_id its ranks answer the same way (a disk KV tier's load,
        kv/tiers/disk_replicas.py)."""
        task.task_id = next(self._task_ids)
        self.replies.expect(task.task_id)
        self.send(task)
        return task.task_id

    def wait(self, task_id: int, timeout_s: float) -> list[Any]:
        """The answers of ranks 1..N-1 to a posted task; raises RankTaskFailed."""
        return self.replies.wait(task_id, self.size - 1, timeout_s)

    def _watch(self) -> None:
        lost = self._read_replies()
        if self._closing:
            return
        log.error("tensor-parallel rank(s) %s went away; exiting (status %d) so that the worker "
                  "is restarted", lost or "?", EXIT_RANK_LOST)
        logging.shutdown()
        os._exit(EXIT_RANK_LOST)

    def _read_replies(self) -> list[int]:
        """Files the ranks' answers until a socket ends; returns the ranks whose socket ended."""
        while True:
            try:
                readable, _, _ = select.select(self.conns, [], [])
            except (OSError, ValueError):
                return []
            for conn in readable:
                try:
                    reply = channel.recv(conn)
                except (OSError, EOFError, pickle.UnpicklingError):
                    return [self.conns.index(conn) + 1]
                if isinstance(reply, RankReply):
                    self.replies.file(reply)

    def close(self) -> None:
        """Stops the other ranks (they exit when told, or when the channel closes)."""
        self._closing = True
        try:
            self.send(None)
        except OSError:
            pass
        for conn in self.conns:
            conn.close()
        self._server.close()
        self._stop_ranks()
        destroy_tp()

    def _stop_ranks(self) -> None:
        pass


class MultiprocExecutor(Executor):
    """One fresh interpreter per rank on this node (`python -m ...rank_worker`, its RankSpec
    pickled on stdin): spawned, not forked, so no CUDA or thread state is inherited, and unlike
    multiprocessing's spawn the caller's __main__ is never re-imported, so a script that builds an
    engine at top level works."""

    backend = "mp"

    def _start_ranks(self, specs: list[RankSpec]) -> None:
        self.procs = []
        for spec in specs:
            proc = subprocess.Popen([sys.executable, "-m", RANK_MODULE], stdin=subprocess.PIPE)
            proc.stdin.write(pickle.dumps(spec))
            proc.stdin.close()
            self.procs.append(proc)
        log.info("started tensor-parallel ranks 1-%d: pids %s", self.size - 1,
                 [p.pid for p in self.procs])

    def _check_alive(self) -> None:
        dead = [(i + 1, p.returncode) for i, p in enumerate(self.procs) if p.poll() is not None]
        if dead:
            raise RuntimeError(f"tensor-parallel rank {dead[0][0]} exited with status "
                               f"{dead[0][1]} while starting (its log says why)")

    def _stop_ranks(self) -> None:
        for p in getattr(self, "procs", []):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def start_executor(engine: EngineConfig, model_dir: str, dtype: torch.dtype,
                   device: torch.device, max_model_len: int,
                   kv_blocks_wanted: int | None) -> Executor:
    """Starts the other ranks with the configured backend and joins them as rank 0."""
    if engine.distributed_executor_backend == "ray":
        from baton.services.engine.parallel.ray_executor import RayExecutor
        cls: type[Executor] = RayExecutor
    else:
        cls = MultiprocExecutor
    set_cpu_threads(engine, device.type)
    executor = cls(engine, model_dir, dtype, device, max_model_len, kv_blocks_wanted)
    try:
        executor.start(device)
    except BaseException:
        executor.close()
        raise
    return executor
