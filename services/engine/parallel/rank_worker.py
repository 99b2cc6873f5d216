"""What a rank other than 0 runs: join the group, load its shard, then run each step rank 0 sends
until told to stop, and each rank task (rank_tasks.py), answering it up the same socket. It exits
when rank 0's channel closes, so a rank never outlives its engine."""
from __future__ import annotations

import logging
import pickle
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from baton.services.common.model_config import load_config
from baton.services.engine.kv.tiers.replicas import TIER_MESSAGES, TierFollower
from baton.services.engine.parallel import channel
from baton.services.engine.parallel.executor import RankSpec, set_cpu_threads
from baton.services.engine.parallel.rank_tasks import RankContext, RankReply, RankTask
from baton.services.engine.parallel.state import destroy_tp, init_tp
from baton.services.engine.parallel.step_sync import StepDecoder, StepMessage

log = logging.getLogger(__name__)


def _device(spec: RankSpec) -> torch.device:
    return torch.device("cuda", spec.local_rank) if spec.device_type == "cuda" else \
        torch.device("cpu")


def serve(spec: RankSpec) -> None:
    """Runs rank spec.rank until rank 0 says stop; raises ChannelClosed when rank 0 is gone."""
    from baton.services.engine.lora.replicas import LoRAFollower
    from baton.services.engine.model_runner import ModelRunner
    set_cpu_threads(spec.engine, spec.device_type)
    conn = channel.connect(spec.host, spec.channel_port, spec.rank, timeout_s=60)
    device = _device(spec)
    init_tp(spec.rank, spec.size, spec.init_method, device,
            spec.engine.distributed_timeout_seconds)
    lora: LoRAFollower | None = None
    tiers: TierFollower | None = None
    try:
        config = load_config(spec.model_dir)
        runner = ModelRunner(spec.engine, config, spec.model_dir, spec.dtype, device,
                             spec.max_model_len, spec.kv_blocks_wanted, follower=True)
        if runner.lora is not None:
            lora = LoRAFollower(spec.engine, config, runner.lora)
        decoder = StepDecoder()
        tasks = _TaskRunner(conn, RankContext(spec.rank, spec.size, runner.kv_cache, config,
                                              spec.node_host))
        tiers = TierFollower(runner.kv_cache, spec.rank, spec.size,
                             lambda task_id, value, error: tasks.send(
                                 RankReply(task_id, spec.rank, value, error)))
        while (message := channel.recv(conn)) is not None:
            if isinstance(message, StepMessage):
                runner.execute_follower(decoder.decode(message), message.score_rows,
                                        message.bucket)
            elif isinstance(message, RankTask):
                tasks.run(message)
            elif isinstance(message, TIER_MESSAGES):  # rank 0's KV tiers' copies
                tiers.apply(message)
            else:  # rank 0's LoRA manager's decisions, the only other messages
                lora.apply(message)
    finally:
        if lora is not None:
            lora.close()
        if tiers is not None:
            tiers.close()
        conn.close()
        destroy_tp()


class _TaskRunner:
    """Runs rank tasks, inline or on a thread, and sends each answer to rank 0."""

    def __init__(self, conn: socket.socket, ctx: RankContext) -> None:
        self._conn, self._ctx = conn, ctx
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(4, thread_name_prefix=f"rank-{ctx.rank}-task")

    def run(self, task: RankTask) -> None:
        if task.inline:
            self._answer(task)
        else:
            self._pool.submit(self._answer, task)

    def _answer(self, task: RankTask) -> None:
        try:
            reply = RankReply(task.task_id, self._ctx.rank, task.run(self._ctx))
        except Exception as e:  # the task's own failure goes to rank 0, which decides
            log.warning("rank task %s failed on rank %d: %s", type(task).__name__,
                        self._ctx.rank, e)
            reply = RankReply(task.task_id, self._ctx.rank, error=str(e) or repr(e))
        self.send(reply)

    def send(self, reply: RankReply) -> None:
        """Sends an answer to rank 0 (from any thread)."""
        with self._lock:
            try:
                channel.send([self._conn], reply)
            except OSError:
                pass  # rank 0 is gone; the main loop sees the channel close and exits


def main(spec: RankSpec) -> None:
    """A spawned rank's entry point (executor.MultiprocExecutor): exits 0 when told to stop, 1 on
    any failure."""
    logging.basicConfig(level=spec.log_level, stream=sys.stderr,
                        format=f"%(asctime)s tp-rank-{spec.rank} %(levelname)s %(name)s: "
                               "%(message)s")
    try:
        serve(spec)
    except channel.ChannelClosed:
        log.error("rank 0 is gone; exiting")
        sys.exit(1)
    except BaseException:
        log.exception("tensor-parallel rank %d failed", spec.rank)
        sys.exit(1)


if __name__ == "__main__":
    main(pickle.load(sys.stdin.buffer))
