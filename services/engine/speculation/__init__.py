"""Speculative decoding: proposers, the verification of their drafts, and its counters."""
