"""Helpers shared by the test packages (real Redis servers, store workers)."""
