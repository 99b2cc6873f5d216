"""`--distributed-executor-backend ray`: the ranks other than 0 as Ray actors, one per bundle of a
placement group of one GPU (one CPU on a CPU-only cluster) per rank, so that a tensor-parallel
group spanning nodes (the operator's LeaderWorkerSet, docs/multi-node.md) is placed as one.

Rank 0 is the engine's own process and holds bundle 0; each actor runs the same rank loop a
spawned process would (rank_worker.serve). The process joins the Ray cluster it finds
(RAY_ADDRESS, or one running on this node), or starts a local one.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from baton.services.engine.parallel.executor import Executor, RankSpec

log = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 120.0


def on_this_node(spec: RankSpec) -> RankSpec:
    """The spec with this Ray node's address as the rank's own: the actor may run on another node
    than rank 0, and a peer worker must reach this rank's NIXL agent there."""
    import ray
    return replace(spec, node_host=ray.util.get_node_ip_address())


class _RankActor:
    def run(self, spec: RankSpec) -> None:
        from baton.services.engine.parallel.rank_worker import serve
        logging.basicConfig(level=spec.log_level)
        serve(on_this_node(spec))


class RayExecutor(Executor):
    backend = "ray"

    def _host(self) -> str:
        import ray
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            ray.init(include_dashboard=False)
        return ray.util.get_node_ip_address()

    def _local_rank(self, rank: int) -> int:
        # Ray gives each actor its own GPU as the only visible one.
        return 0

    def _start_ranks(self, specs: list[RankSpec]) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        gpu = self.spec.device_type == "cuda"
        bundle = {"GPU": 1} if gpu else {"CPU": 1}
        self.pg = placement_group([bundle] * self.size, strategy="PACK")
        ready, _ = ray.wait([self.pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise RuntimeError(f"Ray could not place {self.size} bundles of {bundle} in "
                               f"{PLACEMENT_TIMEOUT_S:g} s: {ray.cluster_resources()} in the "
                               "cluster")
        actor_cls = ray.remote(num_cpus=0 if gpu else 1, num_gpus=1 if gpu else 0)(_RankActor)
        self.actors: list[Any] = []
        self.runs: list[Any] = []
        for spec in specs:
            actor = actor_cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.pg, placement_group_bundle_index=spec.rank)).remote()
            self.actors.append(actor)
            self.runs.append(actor.run.remote(spec))
        log.info("started tensor-parallel ranks 1-%d as Ray actors", self.size - 1)

    def _check_alive(self) -> None:
        import ray
        done, _ = ray.wait(self.runs, timeout=0)
        if done:
            ray.get(done[0])  # raises the actor's error
            raise RuntimeError("a tensor-parallel Ray actor ended while starting")

    def _stop_ranks(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group
        if getattr(self, "runs", None):
            ray.wait(self.runs, num_returns=len(self.runs), timeout=30)
        for actor in getattr(self, "actors", []):
            ray.kill(actor)
        if getattr(self, "pg", None) is not None:
            remove_placement_group(self.pg)
        if self._started_ray:
            ray.shutdown()
