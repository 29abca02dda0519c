"""Parallelizers: how the model and optimizer are placed for a (multi-rank) run and how the
ranks' gradients meet.

A parallelizer has `place(model, optimizer, accelerator) -> (model, optimizer)` and
`sync_gradients(raw_model, accelerator)` (called after backward, before the optimizer step).
Each is registered with `@register_parallelizer("name", wraps_model=..., shards=...)`
(stackwise.registry): `ddp` hands both to Accelerate (DDP), `manual` keeps the model unwrapped
and averages gradients by hand (for several backward passes per step).
"""

from __future__ import annotations

from stackwise.parallel.ddp import DDP
from stackwise.parallel.manual import Manual

__all__ = ["DDP", "Manual"]
