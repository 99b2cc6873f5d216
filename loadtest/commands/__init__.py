"""The `baton bench`, `baton loadtest` and `baton loadtest-compare` commands: the benchmarks and
load generators drive the services from outside, so they live here rather than in services/cli."""
