"""Simulators: a runner that stands in for the forward pass with a cost model (`baton worker
--engine sim`), and virtual-time trace and overload replays of the router onto simulated workers."""
