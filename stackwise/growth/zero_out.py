"""`zero_out`: the new stack starts random with every block's output projections at zero, so
each block adds nothing to the residual stream and the grown rack computes what its trunk
computed: no jump in loss at the growth step.

Attention's o_proj and the feed-forward's down_proj (every MoE expert's, the shared expert's
included) start at zero; their inputs stay random, so the first steps move them off zero.
With progressive.growth.noise > 0 they start small instead of zero, and the function is no
longer exactly preserved (the capability holds for noise 0)."""

from __future__ import annotations

import torch

from stackwise.growth.base import Growth
from stackwise.growth.random import random_init
from stackwise.registry import register_growth_operator

OUTPUTS = ("o_proj.weight", "down_proj.weight")


@register_growth_operator("zero_out", preserves_function=True)
def zero_out(growth: Growth) -> None:
    random_init(growth)
    with torch.no_grad():
        for name, p in growth.stack.named_parameters():
            if name.endswith(OUTPUTS):
                p.zero_()
