"""Quantities written for people: training FLOPs with an SI prefix, in logs, run summaries and
reports. No torch here, so the report reads a run without loading it."""

from __future__ import annotations


def format_flops(value: float) -> str:
    """3 significant figures with an SI prefix: 1.23e+12 -> '1.23T'."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{prefix}"
    return f"{value:.3g}"
