"""`copy_middle`: the new stack starts as a copy of the trunk's middle stack (as MIDAS grows
a model by repeating its middle layers)."""

from __future__ import annotations

from stackwise.growth.base import Growth
from stackwise.growth.copying import copy_stack
from stackwise.growth.random import random_init
from stackwise.registry import register_growth_operator


def middle(n_stacks: int) -> int:
    """The rack position copied from a trunk of `n_stacks`: the middle one, the upper of the
    two middle ones when their count is even."""
    return n_stacks // 2


@register_growth_operator("copy_middle", preserves_function=False, copies_trunk=True)
def copy_middle(growth: Growth) -> None:
    """The middle stack of the trunk in rack order, wherever the new stack goes. Stack 0 has
    nothing to copy: it starts random."""
    if not growth.trunk:
        random_init(growth)
    else:
        copy_stack(growth.trunk[middle(len(growth.trunk))], growth.stack)
