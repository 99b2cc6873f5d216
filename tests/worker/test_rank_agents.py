"""Where a tensor-parallel rank's own NIXL agent listens (issue 26): a rank that shares rank 0's
node serves on the worker's address; a Ray actor, which may run on another node, on its own node's,
so that a peer worker's ranks can reach it."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import ray
import torch

from baton.services.engine.config import EngineConfig
from baton.services.engine.parallel.executor import RankSpec
from baton.services.engine.parallel.rank_tasks import RankContext
from baton.services.engine.parallel.ray_executor import on_this_node
from baton.services.worker.kv_transfer.head_transport import OpenRankAgent

CONFIG = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2)


def _agent_host(node_host: str | None) -> tuple[str, int, int]:
    cache = torch.zeros(2, 8, 2, 4, 1, 8)  # [layers, blocks, K/V, block size, heads, dim]
    ctx = RankContext(1, 2, cache, CONFIG, node_host)
    peer = OpenRankAgent("w", "127.0.0.1", None).run(ctx)
    ctx.state["kv_transport"].close()
    return peer.agent_host, peer.kv_head_start, peer.kv_head_count


def test_a_rank_on_rank_0s_node_serves_on_the_workers_address() -> None:
    assert _agent_host(None) == ("127.0.0.1", 1, 1)


def test_a_rank_on_its_own_node_serves_on_that_nodes_address() -> None:
    # any 127/8 address is this machine's, so a second "node" address can be bound here
    assert _agent_host("127.0.0.2") == ("127.0.0.2", 1, 1)


def test_a_ray_actor_takes_its_nodes_address() -> None:
    spec = RankSpec(1, 2, "10.0.0.1", 1, 2, EngineConfig(), "/m", torch.float32, "cpu", 0, 64,
                    None)
    moved = on_this_node(spec)
    assert moved.node_host == ray.util.get_node_ip_address()
    assert dataclasses.replace(moved, node_host=None) == spec
