"""Growth operators: how a newly grown stack gets its first weights.

An operator is a function `(growth: Growth) -> None` that initialises `growth.stack` in place
(see stackwise.growth.base for what `Growth` holds). Each is registered with
`@register_growth_operator("name", preserves_function=..., copies_trunk=...)`
(stackwise.registry) and chosen by name in `progressive.growth.init`; the builder adds
`progressive.growth.noise` after any operator. Built in: random, copy_last, copy_middle,
stack_all, zero_out.
"""

from __future__ import annotations

from stackwise.growth.base import Growth, add_noise, grow_stack, growth_generator
from stackwise.growth.copy_last import copy_last
from stackwise.growth.copy_middle import copy_middle
from stackwise.growth.copying import copy_stack
from stackwise.growth.random import random_init
from stackwise.growth.stack_all import stack_all, stack_all_source
from stackwise.growth.zero_out import zero_out

__all__ = [
    "Growth",
    "add_noise",
    "copy_last",
    "copy_middle",
    "copy_stack",
    "grow_stack",
    "growth_generator",
    "random_init",
    "stack_all",
    "stack_all_source",
    "zero_out",
]
