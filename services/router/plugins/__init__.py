"""Placement plugins, as llm-d's scheduler has them: filters drop workers, weighted scorers rank the
rest, and a picker chooses (sticky to the cache-warm worker until it saturates, then by load, ties
broken at random)."""
