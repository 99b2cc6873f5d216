"""Tensor parallelism: one process per rank, rank 0 the engine's own process.

Rank 0 owns the scheduler, block manager, prefix cache and sampler; every step it sends the other
ranks what changed (step_sync.py) over a socket each (channel.py), and all ranks run the same
forward pass on their shard of the model (sharding.py, the layers in ../layers), joined by
torch.distributed collectives (state.py). The other ranks run rank_worker.py, started by the
multiprocessing executor on one node (executor.py) or by Ray actors (ray_executor.py).
"""
