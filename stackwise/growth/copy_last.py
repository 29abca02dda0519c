"""`copy_last`: the new stack starts as a copy of the trained stack it will sit next to."""

from __future__ import annotations

from stackwise.growth.base import Growth
from stackwise.growth.copying import copy_stack
from stackwise.growth.random import random_init
from stackwise.registry import register_growth_operator


@register_growth_operator("copy_last", preserves_function=False, copies_trunk=True)
def copy_last(growth: Growth) -> None:
    """The top stack when appending, the bottom one when prepending (the one whose output,
    or input, the new stack takes over). Stack 0 has nothing to copy: it starts random."""
    source = growth.neighbour
    if source is None:
        random_init(growth)
    else:
        copy_stack(source, growth.stack)
