"""Block diffusion (BD3-LM): the sequence is cut into blocks of `block_size` tokens; each block
is a masked-diffusion problem conditioned on the clean blocks before it.

The rack sees [noised; clean] side by side (stackwise.model.masks), so one pass scores every
block. With the shift, token j is predicted from position j - 1 and the first token is given,
never masked (as the causal LM never predicts it); with blocks of one token and t = 1 every
other token is masked and the loss is the causal LM's, on the same weights. Without it, each
masked position predicts its own token (BD3-LM). The loss is the NELBO per bounded token.
"""

from __future__ import annotations

from typing import Any

import torch

from stackwise.objectives.base import IGNORE, Prepared, Specials
from stackwise.objectives.diffusion import Diffusion
from stackwise.objectives.positions import real_tokens, uniforms
from stackwise.objectives.schedules import Schedule, schedule_from
from stackwise.registry import register_objective


def bounded_positions(batch: dict[str, torch.Tensor], pad_id: int, shift: bool) -> torch.Tensor:
    """(B, L) bool: the tokens the NELBO bounds (every real one, but the first with the shift,
    which nothing predicts; on instruction rows the replies only)."""
    out = real_tokens(batch, pad_id).clone()
    out[:, 0] &= not shift
    if "labels" in batch:
        out &= batch["labels"] != IGNORE
    return out


def shifted(values: torch.Tensor, fill: float | int) -> torch.Tensor:
    """values[:, j + 1] at position j (the prediction made there), `fill` at the last."""
    out = torch.full_like(values, fill)
    out[:, :-1] = values[:, 1:]
    return out


@register_objective(
    "block_diffusion",
    masked=True,
    uses_time=True,
    default_sampler="block",
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
    blocks=True,
)
class BlockDiffusion(Diffusion):
    name = "block_diffusion"

    def __init__(
        self, specials: Specials, schedule: Schedule, block_size: int, shift: bool = True, **kw: Any
    ) -> None:
        super().__init__(specials, schedule, **kw)
        self.block_size, self.shift = block_size, shift

    @classmethod
    def from_spec(cls, objective: Any, masking: Any, specials: Specials) -> BlockDiffusion:
        return cls(
            specials,
            schedule_from(masking),
            objective.block_size,
            objective.block_shift,
            eps=masking.eps,
            antithetic=masking.antithetic,
            num_time_steps=masking.num_time_steps,
            uniform_weight=objective.weighting == "uniform",
            bins=getattr(masking, "time_step_bins", None),
        )

    def with_range(self, lo: float, hi: float) -> BlockDiffusion:
        out = BlockDiffusion(
            self.specials,
            self.schedule,
            self.block_size,
            self.shift,
            eps=self.eps,
            antithetic=self.antithetic,
            num_time_steps=self.num_time_steps,
            uniform_weight=self.uniform_weight,
            t_range=(lo, hi),
            bins=self.bins,
        )
        out.causal = self.causal
        return out

    def corrupt(
        self, batch: dict[str, torch.Tensor], t: torch.Tensor, gen: torch.Generator
    ) -> Prepared:
        ids = batch["input_ids"]
        bounded = bounded_positions(batch, self.specials.pad_id, self.shift)
        frac = self.schedule.mask_fraction(t)
        masked = (uniforms(batch, gen, ids.shape[1], stream=1) < frac[:, None]) & bounded
        noised = torch.where(masked, self.specials.mask_id, ids)
        scored = shifted(masked, False) if self.shift else masked
        targets = torch.where(scored, shifted(ids, IGNORE) if self.shift else ids, IGNORE)
        elbo_w = self.schedule.weight(t)[:, None] * scored.float()
        weights = scored.float() if self.uniform_weight else elbo_w
        padding = batch.get("attention_mask")
        return Prepared(
            torch.cat([noised, ids], dim=1),
            targets,
            weights,
            bounded.sum(),
            torch.cat([padding, padding], dim=1) if padding is not None else None,
            t=t,
            elbo_weights=elbo_w,
            bounded=bounded,
        )
