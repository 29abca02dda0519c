"""Masking schedules for diffusion: alpha(t) (fraction kept) and the NELBO weight.

The weight is w(t) = -alpha'(t) / (1 - alpha(t)); for the linear schedule that is 1/t.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from stackwise.registry import SCHEDULES, register_schedule


class Schedule:
    """A registered schedule is built with `build(eps, num_steps, fractions)` (the masking
    section's eps, num_time_steps and time_step_mask_fractions); most read none of them."""

    @classmethod
    def build(
        cls, eps: float, num_steps: int | None, fractions: dict[int, float] | None
    ) -> Schedule:
        return cls()

    def mask_fraction(self, t: torch.Tensor) -> torch.Tensor:
        """1 - alpha(t)."""
        raise NotImplementedError

    def weight(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@register_schedule("linear")
class Linear(Schedule):
    def mask_fraction(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def weight(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 / t


@register_schedule("loglinear")
class LogLinear(Schedule):
    """MDLM's log-linear noise: sigma(t) = -log(1 - (1 - eps) t), so alpha = 1 - (1 - eps) t."""

    def __init__(self, eps: float) -> None:
        self.eps = eps

    @classmethod
    def build(
        cls, eps: float, num_steps: int | None, fractions: dict[int, float] | None
    ) -> Schedule:
        return cls(eps)

    def mask_fraction(self, t: torch.Tensor) -> torch.Tensor:
        return (1.0 - self.eps) * t

    def weight(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 / t


@register_schedule("cosine")
class Cosine(Schedule):
    """alpha(t) = cos(pi t / 2)."""

    def mask_fraction(self, t: torch.Tensor) -> torch.Tensor:
        return 1.0 - torch.cos(0.5 * math.pi * t)

    def weight(self, t: torch.Tensor) -> torch.Tensor:
        return 0.5 * math.pi * torch.sin(0.5 * math.pi * t) / (1.0 - torch.cos(0.5 * math.pi * t))


@register_schedule("table")
class Table(Schedule):
    """A table {step: fraction} over `num_steps` steps, step k sitting at t = (k + 1) / T.

    The fraction is linear between listed steps and from (t=0, 0) to the first listed step, and
    constant after the last. A point exactly on a knot takes the slope of the segment to its
    left, so grid draws get the weight of the interval they close.
    """

    def __init__(self, num_steps: int, fractions: dict[int, float]) -> None:
        steps = sorted(fractions)
        self.knots_t = [0.0] + [(s + 1) / num_steps for s in steps]
        self.knots_m = [0.0] + [fractions[s] for s in steps]

    @classmethod
    def build(
        cls, eps: float, num_steps: int | None, fractions: dict[int, float] | None
    ) -> Schedule:
        assert num_steps is not None and fractions is not None
        return cls(num_steps, fractions)

    def _segment(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kt = torch.tensor(self.knots_t, dtype=torch.float64, device=t.device)
        km = torch.tensor(self.knots_m, dtype=torch.float64, device=t.device)
        tt = t.double()
        # find the segment in t's own precision: float32(0.1) is 0.1000000015 in float64, which
        # would put a draw exactly on a knot into the segment to its right
        kt_same = kt.to(t.dtype) if t.is_floating_point() else kt
        hi = torch.searchsorted(kt_same, t.contiguous(), right=False).clamp(1, len(kt) - 1)
        lo = hi - 1
        slope = (km[hi] - km[lo]) / (kt[hi] - kt[lo])
        beyond = t > kt_same[-1]
        slope = torch.where(beyond, torch.zeros_like(slope), slope)
        frac = torch.where(beyond, km[-1], km[lo] + slope * (tt - kt[lo]).clamp_min(0.0))
        return frac, slope, beyond

    def mask_fraction(self, t: torch.Tensor) -> torch.Tensor:
        return self._segment(t)[0].to(t.dtype)

    def weight(self, t: torch.Tensor) -> torch.Tensor:
        frac, slope, _ = self._segment(t)
        return (slope / frac.clamp_min(1e-12)).to(t.dtype)


def build_schedule(
    name: str, eps: float, num_steps: int | None, fractions: dict[int, float] | None
) -> Schedule:
    """The schedule registered as `name` (a class builds through `build`, a factory function
    is called with the same arguments); an unknown name is the registry's error."""
    entry = SCHEDULES.get(name, "masking.schedule")
    return getattr(entry, "build", entry)(eps, num_steps, fractions)


def schedule_from(masking: Any) -> Schedule:
    """The schedule a masking section (or spec) names, built from its fields."""
    return build_schedule(
        masking.schedule, masking.eps, masking.num_time_steps, masking.time_step_mask_fractions
    )


def time_for_fraction(schedule: Schedule, frac: torch.Tensor, iters: int = 40) -> torch.Tensor:
    """Invert mask_fraction by bisection (every schedule here is non-decreasing in t)."""
    lo = torch.zeros_like(frac, dtype=torch.float32)
    hi = torch.ones_like(frac, dtype=torch.float32)
    for _ in range(iters):
        mid = (lo + hi) / 2
        below = schedule.mask_fraction(mid) < frac
        lo = torch.where(below, mid, lo)
        hi = torch.where(below, hi, mid)
    return hi.clamp(1e-4, 1.0)
