"""`ddp`: Accelerate prepares model and optimizer (DistributedDataParallel on several ranks),
so gradients are averaged during backward."""

from __future__ import annotations

from typing import Any

from torch import nn

from stackwise.registry import register_parallelizer


@register_parallelizer("ddp", wraps_model=True, shards=False)
class DDP:
    def place(self, model: nn.Module, optimizer: Any, accelerator: Any) -> tuple[Any, Any]:
        return accelerator.prepare(model, optimizer)

    def sync_gradients(self, raw_model: nn.Module, accelerator: Any) -> None:
        """Nothing to do: DDP averaged them during backward."""
