"""Durations as every command prints them (``hpcppo status``, ``follow``, ``metrics summary``, ``compare``): at the
bottom of the layers, so that showing a time needs no job-status code."""

from __future__ import annotations

__all__ = ["format_elapsed"]


def format_elapsed(seconds: float | None) -> str:
    """``H:MM:SS``, or ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"
