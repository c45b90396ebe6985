"""Seeing runs from a login node: plots, the live view, logs and the run list (no torch)."""
