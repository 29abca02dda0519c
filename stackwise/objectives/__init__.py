"""Objectives turn a batch into (inputs, targets, weights). Each registers itself with
`@register_objective` (stackwise.registry) in its own module; `objective_from` builds the one
a spec names."""

from __future__ import annotations

from typing import Any

from stackwise.objectives.base import IGNORE, Objective, Prepared, Specials, token_ce
from stackwise.objectives.block_diffusion import BlockDiffusion
from stackwise.objectives.clm import CLM
from stackwise.objectives.custom import Custom
from stackwise.objectives.diffusion import Diffusion
from stackwise.objectives.mlm import MLM
from stackwise.objectives.schedules import build_schedule, schedule_from
from stackwise.registry import OBJECTIVES


def objective_from(objective: Any, masking: Any, specials: Specials) -> Objective:
    """The objective `objective.name` names, built from `objective` and `masking` (anything
    with the fields of the config's objective and masking sections). A registered class builds
    through its `from_spec`; a registered factory function is called with the same arguments."""
    entry = OBJECTIVES.get(objective.name, "objective.name")
    obj: Objective = getattr(entry, "from_spec", entry)(objective, masking, specials)
    obj.causal = objective.causal
    return obj


def build_objective(config: Any, specials: Specials) -> Objective:
    """`objective_from` for a whole config (its `objective` and `masking` sections)."""
    return objective_from(config.objective, config.masking, specials)


__all__ = [
    "CLM",
    "IGNORE",
    "MLM",
    "BlockDiffusion",
    "Custom",
    "Diffusion",
    "Objective",
    "Prepared",
    "Specials",
    "build_objective",
    "build_schedule",
    "objective_from",
    "schedule_from",
    "token_ce",
]
