"""Masked diffusion (MDLM/LLaDA): mask each token with probability 1 - alpha(t).

Loss = sum_i w(t_i) * sum_{masked j} CE_ij / (number of real tokens), the NELBO per token, whose
exponential bounds the perplexity.
"""

from __future__ import annotations

import torch

from stackwise.objectives.base import IGNORE, Objective, Prepared, Specials, real_tokens
from stackwise.objectives.schedules import Schedule


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
    ) -> None:
        super().__init__(specials)
        self.schedule = schedule
        self.eps = eps
        self.antithetic = antithetic
        self.num_time_steps = num_time_steps
        self.uniform_weight = uniform_weight

    def sample_t(self, b: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
        """t in (0, 1]: antithetic draws spread one uniform over the batch (lower variance)."""
        if self.antithetic:
            u = torch.rand(1, generator=gen, device=device) + torch.arange(b, device=device) / b
            u = u % 1.0
        else:
            u = torch.rand(b, generator=gen, device=device)
        if self.num_time_steps is not None:
            steps = self.num_time_steps
            return (torch.floor(u * steps).clamp(max=steps - 1) + 1) / steps
        return self.eps + (1.0 - self.eps) * u

    def corrupt(
        self, batch: dict[str, torch.Tensor], t: torch.Tensor, gen: torch.Generator
    ) -> Prepared:
        ids = batch["input_ids"]
        b, n = ids.shape
        real = real_tokens(batch, self.specials.pad_id)
        frac = self.schedule.mask_fraction(t)
        masked = (torch.rand(b, n, generator=gen, device=ids.device) < frac[:, None]) & real
        inputs = torch.where(masked, self.specials.mask_id, ids)
        targets = torch.where(masked, ids, IGNORE)
        elbo_w = self.schedule.weight(t)[:, None] * masked.float()
        weights = masked.float() if self.uniform_weight else elbo_w
        return Prepared(
            inputs=inputs,
            targets=targets,
            weights=weights,
            normalizer=real.sum(),
            attention_mask=batch.get("attention_mask"),
            t=t,
            elbo_weights=elbo_w,
        )

    def prepare(self, batch: dict[str, torch.Tensor], gen: torch.Generator) -> Prepared:
        ids = batch["input_ids"]
        return self.corrupt(batch, self.sample_t(ids.shape[0], gen, ids.device), gen)
