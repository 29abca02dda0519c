"""Growth operators: how a newly grown stack gets its first weights.

An operator is a callable `(new_stack, trunk_stacks, rack) -> None` that initialises
`new_stack` in place (`trunk_stacks`: the rack's stacks before it joins, in rack order). Each is
registered with `@register_growth_operator("name", preserves_function=...)` (stackwise.registry)
and chosen by name in `ProgressiveRackBuilder(growth_operator=...)`.
"""

from __future__ import annotations

from stackwise.growth.random import random_init

__all__ = ["random_init"]
