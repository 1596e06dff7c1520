"""Dynamic Consistency Boundaries over the one log: tagged events, queries, conditional append."""
