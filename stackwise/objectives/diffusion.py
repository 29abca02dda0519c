"""Masked diffusion (MDLM/LLaDA): mask each token with probability 1 - alpha(t).

Loss = sum_i w(t_i) * sum_{masked j} CE_ij / (number of real tokens), the NELBO per token, whose
exponential bounds the perplexity. On instruction rows only reply tokens are masked and counted
(LLaDA's SFT recipe: the prompt is always seen, the loss is per reply token).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from stackwise.objectives.base import IGNORE, Objective, Prepared, Specials
from stackwise.objectives.positions import masked_targets, real_tokens, uniforms
from stackwise.objectives.schedules import Schedule, schedule_from
from stackwise.registry import register_objective


@register_objective(
    "diffusion",
    masked=True,
    uses_time=True,
    default_sampler="ancestral",
    nelbo=True,
    masking_fields=(
        "schedule",
        "eps",
        "antithetic",
        "num_time_steps",
        "time_step_bins",
        "time_step_mask_fractions",
    ),
    instruction_rows=True,
)
class Diffusion(Objective):
    name = "diffusion"

    def __init__(
        self,
        specials: Specials,
        schedule: Schedule,
        eps: float = 1e-3,
        antithetic: bool = True,
        num_time_steps: int | None = None,
        uniform_weight: bool = False,
        t_range: tuple[float, float] = (0.0, 1.0),
        bins: tuple[int, ...] | None = None,
    ) -> None:
        """`bins`: the grid steps t is drawn from (masking.time_step_bins; None: every one)."""
        super().__init__(specials)
        self.schedule = schedule
        self.eps = eps
        self.antithetic = antithetic
        self.num_time_steps = num_time_steps
        self.uniform_weight = uniform_weight
        self.t_range = t_range
        self.bins = tuple(bins) if bins is not None else None

    @classmethod
    def from_spec(cls, objective: Any, masking: Any, specials: Specials) -> Diffusion:
        return cls(
            specials,
            schedule_from(masking),
            eps=masking.eps,
            antithetic=masking.antithetic,
            num_time_steps=masking.num_time_steps,
            uniform_weight=objective.weighting == "uniform",
            bins=getattr(masking, "time_step_bins", None),
        )

    def with_range(self, lo: float, hi: float) -> Diffusion:
        """The same objective restricted to t in (lo, hi]: how a stack trains at its depth."""
        out = Diffusion(
            self.specials,
            self.schedule,
            self.eps,
            self.antithetic,
            self.num_time_steps,
            self.uniform_weight,
            (lo, hi),
            self.bins,
        )
        out.causal = self.causal
        return out

    def grid_steps(self) -> list[int]:
        """Grid steps k (t = (k+1)/T) inside t_range, among the bins when given; the nearest
        one if the range holds none."""
        assert self.num_time_steps is not None
        steps = self.num_time_steps
        lo, hi = self.t_range
        allowed = sorted(self.bins) if self.bins is not None else range(steps)
        inside = [k for k in allowed if lo < (k + 1) / steps <= hi + 1e-9]
        if inside:
            return inside
        near = min(steps - 1, max(0, math.ceil(hi * steps) - 1))
        return [min(allowed, key=lambda k: abs(k - near))]

    def t_from_uniform(self, u: torch.Tensor) -> torch.Tensor:
        lo, hi = self.t_range
        if self.num_time_steps is not None:
            steps = torch.tensor(self.grid_steps(), device=u.device, dtype=torch.float32)
            pick = torch.floor(u * len(steps)).long().clamp(max=len(steps) - 1)
            return (steps[pick] + 1) / self.num_time_steps
        lo = max(lo, self.eps)
        return lo + (hi - lo) * u

    def sample_t(self, b: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
        """Antithetic draws spread one uniform over the batch (lower variance)."""
        if self.antithetic:
            u = torch.rand(1, generator=gen, device=device) + torch.arange(b, device=device) / b
            u = u % 1.0
        else:
            u = torch.rand(b, generator=gen, device=device)
        return self.t_from_uniform(u)

    def corrupt(
        self, batch: dict[str, torch.Tensor], t: torch.Tensor, gen: torch.Generator
    ) -> Prepared:
        ids = batch["input_ids"]
        real = real_tokens(batch, self.specials.pad_id)
        if "labels" in batch:  # instruction rows: only replies are masked, never the prompt
            real = real & (batch["labels"] != IGNORE)
        frac = self.schedule.mask_fraction(t)
        masked = (uniforms(batch, gen, ids.shape[1], stream=1) < frac[:, None]) & real
        inputs = torch.where(masked, self.specials.mask_id, ids)
        targets = masked_targets(ids, masked)
        elbo_w = self.schedule.weight(t)[:, None] * masked.float()
        weights = masked.float() if self.uniform_weight else elbo_w
        extra = {"t": t, "elbo_weights": elbo_w}
        return Prepared.for_batch(batch, inputs, targets, weights, real.sum(), **extra)

    def prepare(self, batch: dict[str, torch.Tensor], gen: torch.Generator) -> Prepared:
        ids = batch["input_ids"]
        if "t" in batch:
            t = batch["t"].to(ids.device).float()
        elif "mask_key" in batch:
            t = self.t_from_uniform(uniforms(batch, gen, 1, stream=0).squeeze(1))
        else:
            t = self.sample_t(ids.shape[0], gen, ids.device)
        return self.corrupt(batch, t, gen)
