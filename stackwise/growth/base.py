"""What a growth operator is told when a stack is grown, and the noise every operator shares.

The builder makes one `Growth` per new stack, calls the operator with it (`grow_stack`), then
adds `progressive.growth.noise` on top, so a user's operator gets the noise too without
drawing it itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from stackwise import seeds
from stackwise.model.layers import Stack
from stackwise.model.rack import Rack


@dataclass(frozen=True, eq=False)
class Growth:
    """One growth step, as the operator sees it.

    `stack` is the new stack: float32, on the CPU, not yet in the rack. `trunk` holds the
    rack's stacks before it joins, in rack order; `grown` the same stacks in growth order
    (`grown[g]` is growth index g). `position` is where the new stack will sit (0: prepended,
    len(trunk): appended) and `index` its growth index. `generator` is seeded from the run's
    seed and `index` alone, so a resumed run draws what an uninterrupted one drew."""

    stack: Stack
    trunk: tuple[Stack, ...]
    grown: tuple[Stack, ...]
    position: int
    index: int
    rack: Rack
    noise: float
    generator: torch.Generator

    @property
    def neighbour(self) -> Stack | None:
        """The trained stack the new one will touch: the top one when appending, the bottom
        one when prepending; None while there is no trunk."""
        if not self.trunk:
            return None
        return self.trunk[self.position - 1] if self.position > 0 else self.trunk[0]


def growth_generator(index: int) -> torch.Generator:
    """The generator of stack `index`'s noise: seeded from the seed the run set (train.seed,
    which torch.initial_seed reports, a restored RNG state included) and the index."""
    return torch.Generator().manual_seed(seeds.growth_noise(torch.initial_seed(), index))


def add_noise(growth: Growth) -> None:
    """N(0, (noise x init_std)^2) on every weight matrix of the new stack (norms and biases
    are left alone): copies stop being exact twins, so their gradients can differ."""
    if growth.noise <= 0:
        return
    std = growth.noise * growth.rack.cfg.init_std
    with torch.no_grad():
        for p in growth.stack.parameters():
            if p.ndim >= 2 and p.is_floating_point():
                draw = torch.randn(p.shape, generator=growth.generator, dtype=torch.float32)
                p.add_((draw * std).to(device=p.device, dtype=p.dtype))


def grow_stack(operator: Callable[[Growth], None], growth: Growth) -> None:
    """Initialise the new stack: the operator, then the noise."""
    operator(growth)
    add_noise(growth)
