"""Objectives turn a batch into (inputs, targets, weights); `build_objective` picks one."""

from __future__ import annotations

from stackwise.config import Config
from stackwise.objectives.base import IGNORE, Objective, Prepared, Specials, token_ce
from stackwise.objectives.clm import CLM
from stackwise.objectives.custom import Custom
from stackwise.objectives.diffusion import Diffusion
from stackwise.objectives.mlm import MLM
from stackwise.objectives.schedules import build_schedule


def build_objective(config: Config, specials: Specials) -> Objective:
    o, m = config.objective, config.masking
    obj: Objective
    if o.name == "clm":
        obj = CLM(specials)
    elif o.name == "mlm":
        obj = MLM(specials, m.mask_ratio, m.bert_mix)
    elif o.name == "diffusion":
        sched = build_schedule(m.schedule, m.eps, m.num_time_steps, m.time_step_mask_fractions)
        obj = Diffusion(
            specials,
            sched,
            eps=m.eps,
            antithetic=m.antithetic,
            num_time_steps=m.num_time_steps,
            uniform_weight=o.weighting == "uniform",
        )
    else:
        obj = Custom(specials, o.causal)
    obj.causal = o.causal
    return obj


__all__ = [
    "CLM",
    "IGNORE",
    "MLM",
    "Custom",
    "Diffusion",
    "Objective",
    "Prepared",
    "Specials",
    "build_objective",
    "token_ce",
]
