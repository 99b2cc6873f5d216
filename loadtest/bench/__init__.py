"""Benchmark engines behind `baton bench ...`: engine throughput against transformers, the decode
step against its memory-bandwidth floor, and a KV source process for the transfer benchmarks."""
