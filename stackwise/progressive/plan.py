"""What each stage of a progressive run gets: its noise range, objective, step budget and slice
of the LR schedule. Pure functions of the config and the data size, decided before training."""

from __future__ import annotations

import itertools
import math
from typing import Any

from torch.optim.lr_scheduler import LambdaLR

from stackwise.config import Config, derive
from stackwise.errors import StackWiseError
from stackwise.model.chain import DenoisingChain
from stackwise.objectives import Diffusion, Objective, Specials, build_objective
from stackwise.progressive.timing import TimeMapping, depth_range
from stackwise.train.optim import lr_factor


class GrowthPlan:
    def __init__(
        self,
        config: Config,
        specials: Specials,
        n_items: int,
        processes: int,
        time_mapping: TimeMapping | None = None,
    ) -> None:
        self.config, self.p, self.specials = config, config.progressive, specials
        self.n_items, self.processes, self.time_mapping = n_items, processes, time_mapping
        self._chain = self._build_chain()
        if time_mapping is not None:
            self.check_mapping()

    def t_range(self, index: int) -> tuple[float, float] | None:
        """Stack `index`'s noise range, always mapped over model.n_stacks (the full depth),
        so growing in several calls or stopping early never changes a stack's range."""
        if self.config.objective.name != "diffusion" or self.p.time_interpretation != "depth":
            return None
        return depth_range(
            index,
            self.config.model.n_stacks,
            self.p,
            self.config.masking.num_time_steps,
            self.time_mapping,
        )

    def objective_for(self, cfg: Config, t_range: tuple[float, float] | None) -> Objective:
        obj = build_objective(cfg, self.specials)
        if t_range is not None:
            assert isinstance(obj, Diffusion)
            obj = obj.with_range(*t_range)
        return obj

    def budget(self, index: int, n_items: int, n_stacks: int) -> int:
        over = self.p.stacks.get(index)
        tc = self.config.train
        per_step = tc.batch_size * tc.grad_accum_steps * self.processes
        epochs = over.epochs if over and over.epochs else self.p.epochs_per_stack
        if over and over.steps:
            return over.steps
        if (over and over.epochs) or (self.p.epochs_per_stack and not self.p.steps_per_stack):
            assert epochs is not None
            return max(1, math.ceil(epochs * n_items / per_step))
        if self.p.steps_per_stack:
            return self.p.steps_per_stack
        return max(1, tc.max_steps // n_stacks)

    def global_scheduler(self, optimizer: Any, cfg: Config, index: int) -> LambdaLR:
        """Stage `index`'s slice of one schedule over every stage's steps (lr_schedule global):
        the warmup happens once, in stage 0, and the LR only decays after it."""
        n = self.config.model.n_stacks
        budgets = [self.budget(i, self.n_items, n) for i in range(n)]
        offset = sum(budgets[:index])
        whole = cfg.train.model_copy(update={"max_steps": sum(budgets)})
        return LambdaLR(optimizer, lambda step: lr_factor(offset + step, whole))

    def chain(self) -> DenoisingChain | None:
        """The denoising chain of a rack grown high-noise-to-low (time as depth), else None."""
        return self._chain

    def _build_chain(self) -> DenoisingChain | None:
        if self.p.time_interpretation != "depth" or self.p.depth_order != "high_to_low":
            return None
        objective = build_objective(self.config, self.specials)
        assert isinstance(objective, Diffusion)
        return DenoisingChain(self.specials.mask_id, objective.schedule.mask_fraction)

    def check_mapping(self) -> None:
        n = self.config.model.n_stacks
        ranges = [self.t_range(i) for i in range(n)]
        if all(r is not None for r in ranges):
            top = max(r[1] for r in ranges if r is not None)
            if top < 1.0 - 1e-9:
                raise StackWiseError(
                    f"The time mapping gives the {n} stacks noise levels up to t={top:g} only, but "
                    "sampling starts from full noise (t=1). Make the last stack's range reach 1."
                )
            tops = [r[1] for r in ranges if r is not None]
            if self.chain() and any(b >= a for a, b in itertools.pairwise(tops)):
                raise StackWiseError(
                    f"progressive.depth_order: high_to_low grows a denoising chain from stack 0 "
                    f"at the highest noise down; the time mapping gives range tops {tops}, which "
                    "do not decrease. Give stack 0 the noisiest range."
                )


def stage_derive(config: Config, **sections: dict[str, Any]) -> Config:
    """A stage's config: its budget is its train.max_steps, so the per-stack budget keys
    have been resolved; `sections` maps a section name to the keys it changes."""
    changes: dict[str, Any] = {
        "progressive.steps_per_stack": None,
        "progressive.epochs_per_stack": None,
    }
    for sec, values in sections.items():
        changes.update({f"{sec}.{key}": value for key, value in values.items()})
    return derive(config, changes, "a stage's config")
