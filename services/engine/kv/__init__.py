"""The paged KV cache: its sizing and allocation (kv_cache), block bookkeeping and the prefix cache
(block_manager), the life of blocks lent across a hand-off (handoff), and where blocks lie in memory
and how they are copied (layout, block_copy). What moves blocks between workers, over the network
or between processes, is the worker's (baton.services.worker.kv_transfer)."""
