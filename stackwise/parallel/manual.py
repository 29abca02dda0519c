"""`manual`: the model stays unwrapped on the accelerator's device and ranks average their
gradients by hand after backward; for steps that run several backward passes (local losses),
which DDP's one-backward contract does not allow."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from stackwise.registry import register_parallelizer
from stackwise.train.hardware import average_gradients


@register_parallelizer("manual", wraps_model=False, shards=False)
class Manual:
    def place(self, model: nn.Module, optimizer: Any, accelerator: Any) -> tuple[Any, Any]:
        """The model on the device (every rank starting from rank 0's weights), the optimizer
        prepared by Accelerate."""
        model = model.to(accelerator.device)
        if accelerator.num_processes > 1:  # without DDP nothing else makes the ranks agree
            import torch.distributed as dist

            with torch.no_grad():
                for p in model.parameters():
                    dist.broadcast(p.data, src=0)
        return model, accelerator.prepare(optimizer)

    def sync_gradients(self, raw_model: nn.Module, accelerator: Any) -> None:
        average_gradients(raw_model, accelerator)
