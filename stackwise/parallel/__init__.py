"""Parallelizers: how the model and optimizer are placed for a (multi-rank) run and how the
ranks' gradients meet.

A parallelizer has `place(model, optimizer, accelerator) -> (model, optimizer)` and
`sync_gradients(raw_model, accelerator)` (called after backward, before the optimizer step);
optionally `configure(parallel_spec)` (the plan's parallel section) and `shard(model,
accelerator) -> model`, called before the optimizer is made (it must see sharded parameters).
Each is registered with `@register_parallelizer("name", wraps_model=..., shards=...)`
(stackwise.registry): `ddp` hands both to Accelerate (DDP), `manual` keeps the model unwrapped
and averages gradients by hand (for several backward passes per step), `fsdp` shards it with
FSDP2, `deepspeed` hands it to a DeepSpeed ZeRO engine (whose `backward` and own stepping the
step uses: `steps_itself`).
"""

from __future__ import annotations

from stackwise.parallel.ddp import DDP
from stackwise.parallel.deepspeed import DeepSpeed
from stackwise.parallel.fsdp import FSDP
from stackwise.parallel.manual import Manual

__all__ = ["DDP", "FSDP", "DeepSpeed", "Manual"]
