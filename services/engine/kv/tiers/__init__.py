"""KV-cache tiers below the device cache: host memory (host), then local disk (disk).

A full, hashed device block whose last user lets go is copied to the host tier off the engine
thread (copier); a block the host tier's LRU pushes out is written to a checksummed file in the
disk tier. A request whose prefix misses the device cache but hits a tier waits in a loading state
while its blocks are copied back into device blocks, then computes only the rest of its prompt.
TierManager (manager) is the one interface the block manager and the scheduler use. Under tensor
parallelism rank 0's tiers decide and the other ranks' follow (replicas, disk_replicas).
"""
