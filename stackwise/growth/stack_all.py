"""`stack_all`: the new stacks repeat the whole trained trunk (as G_stack grows a model by
stacking copies of all of it), one stack per stage."""

from __future__ import annotations

from stackwise.errors import StackWiseError
from stackwise.growth.base import Growth
from stackwise.growth.copying import copy_stack
from stackwise.growth.random import random_init
from stackwise.registry import register_growth_operator


def stack_all_source(index: int) -> int:
    """The growth index stack `index` (>= 1) copies: index - 2^floor(log2 index).

    The trunk doubles: stack 1 copies 0 (trunk [0, 0']), stacks 2 and 3 copy 0 and 1
    ([0, 0', 0'', 0''']), stacks 4..7 copy 0..3, and so on: stacks 2^k .. 2^(k+1) - 1 are the
    first 2^k repeated in growth order (in rack order too, appending or prepending)."""
    return index - (1 << (index.bit_length() - 1))


@register_growth_operator("stack_all", preserves_function=False, copies_trunk=True)
def stack_all(growth: Growth) -> None:
    """Copy stack `stack_all_source(index)` (growth order). Stack 0 starts random."""
    if growth.index == 0:
        random_init(growth)
        return
    source = stack_all_source(growth.index)
    if source >= len(growth.grown):
        raise StackWiseError(
            f"Growth operator 'stack_all' starts stack {growth.index} as a copy of stack "
            f"{source}, but only {len(growth.grown)} stack(s) were grown so far. Grow the "
            "stacks in order, or use progressive.growth.init: random."
        )
    copy_stack(growth.grown[source], growth.stack)
