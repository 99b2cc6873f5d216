"""Checkpoint folders Baton makes itself (the embedded tiny model), shared by every service and the
tests."""
