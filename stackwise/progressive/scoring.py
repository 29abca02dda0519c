"""How a grown rack is scored at the end of a progressive run."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def routed_scores(
    rack: Any, ranges: list[tuple[int, float, float]] | None, chain: Any, score: Callable[[], dict]
) -> dict[str, float]:
    """`score()` of the rack, like any other model. With time as depth (`ranges`) the rack is
    scored as it samples, routed by noise level (each t runs the stacks grown up to the one
    trained for it), and the whole rack's score is kept beside it (`whole_rack_nelbo`) so the
    two can be compared."""
    if ranges is None:
        return score()
    rack.set_depth_routing(None)
    whole = score()
    rack.set_depth_routing(ranges, chain)
    if not whole:  # no validation data (a dataloader of the caller's alone): nothing to score
        return whole
    routed = score()
    routed["whole_rack_nelbo"] = whole["nelbo"]
    if "bpc" in whole:
        routed["whole_rack_bpc"] = whole["bpc"]
    return routed
