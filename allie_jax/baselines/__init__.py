"""Baseline players from other projects, reimplemented here: Maia-1 (lc0 networks) in JAX."""
