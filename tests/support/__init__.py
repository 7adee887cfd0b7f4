"""Helpers shared by the tests: stand-in servers, load makers, small fixtures (not tests)."""
