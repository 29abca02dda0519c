"""Time as depth: which noise range (t_lo, t_hi] each stack trains at.

Stacks are numbered by growth order g = 0, 1, ... and the built-in mappings make t grow with g
(`depth_order: low_to_high`). In append mode stack g sits at position g, so noise runs low to
high from the embeddings towards the head; in prepend mode stack g sits before all earlier ones,
so the finished rack runs from high noise at the embeddings to low noise next to the head.
`depth_order: high_to_low` mirrors them (stack 0 takes the top of the range): the stacks are then
grown as one denoising chain (stackwise.model.chain). A table or a callable is taken as given;
a callable may return a discrete time step (an int) instead of t.
"""

from __future__ import annotations

from collections.abc import Callable

from stackwise.errors import StackWiseError
from stackwise.spec import ProgressiveSpec

# (growth index, number of stacks, num_time_steps or None) -> t, (t_lo, t_hi), or an int: a
# discrete time step k of num_time_steps (the grid point t = (k + 1) / num_time_steps)
TimeMapping = Callable[[int, int, int | None], float | int | tuple[float, float]]


def _as_range(value: float | tuple[float, float] | list[float]) -> tuple[float, float]:
    if isinstance(value, float | int):
        return float(value), float(value)
    lo, hi = value
    return float(lo), float(hi)


def _mapped(value: float | int | tuple[float, float], num_time_steps: int | None) -> tuple:
    """A mapping function's answer as a t range; an int is a discrete time step."""
    if isinstance(value, int) and not isinstance(value, bool):
        if num_time_steps is None:
            raise StackWiseError(
                f"The time mapping gave time step {value}, a step of masking.num_time_steps, "
                "which is not set. Set masking.num_time_steps, or return t in [0, 1]."
            )
        t = (value + 1) / num_time_steps
        return t, t
    return _as_range(value)


def depth_range(
    index: int,
    n_stacks: int,
    spec: ProgressiveSpec,
    num_time_steps: int | None = None,
    mapping: TimeMapping | None = None,
) -> tuple[float, float]:
    """The t range stack `index` (growth order) of `n_stacks` trains at."""
    if not 0 <= index < n_stacks:
        raise ValueError(f"stack {index} is outside 0..{n_stacks - 1}")
    if mapping is not None:
        lo, hi = _mapped(mapping(index, n_stacks, num_time_steps), num_time_steps)
    elif spec.depth_mapping == "custom":
        assert spec.depth_time_table is not None
        lo, hi = _as_range(spec.depth_time_table[index])
    elif spec.depth_order == "high_to_low":  # the low_to_high range of the mirrored stack
        lo, hi = _low_to_high(n_stacks - 1 - index, n_stacks, spec, num_time_steps)
    else:
        lo, hi = _low_to_high(index, n_stacks, spec, num_time_steps)
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(
            f"time mapping gave ({lo}, {hi}) for stack {index}; need 0 <= lo <= hi <= 1"
        )
    return lo, hi


def _low_to_high(
    index: int, n_stacks: int, spec: ProgressiveSpec, num_time_steps: int | None
) -> tuple[float, float]:
    """The built-in mappings with t growing with the growth index."""
    if spec.depth_mapping == "exponential":
        g = spec.depth_growth
        total = g**n_stacks - 1.0
        return (g**index - 1.0) / total, (g ** (index + 1) - 1.0) / total
    if spec.time_per_stack is not None and num_time_steps is not None:
        w = spec.time_per_stack
        return index * w / num_time_steps, (index + 1) * w / num_time_steps
    return index / n_stacks, (index + 1) / n_stacks
