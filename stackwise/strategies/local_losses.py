"""`local_losses` (end_to_end_scope: stackwise): every stack at once, each on its own loss.

Stack i reads stack i-1's output detached, and is scored through the shared norm and head. Each
stack's backward runs before the next stack's forward, so at any moment only one stack's
activations (plus the head's) are alive: peak activation memory is about one stack's, not the
rack's. The reported loss is the last stack's, i.e. the loss of the whole rack's prediction.
Several backward passes a step do not fit DDP's one-backward contract, so the model is placed
by the `manual` parallelizer (gradients averaged over ranks by hand).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from stackwise.data.pack import PreparedData
from stackwise.model.rack import Rack
from stackwise.strategies.base import RunResult, register_training_strategy
from stackwise.strategies.standard import run_end_to_end
from stackwise.train.adapters import ModelAdapter
from stackwise.train.strategy import TrainingStrategy, accumulating, training_batch


@register_training_strategy("local_losses", parallelizer="manual")
class LocalLossStrategy(TrainingStrategy):
    def train_step(
        self,
        model: nn.Module,
        batch: dict[str, torch.Tensor],
        optimizer: Any,
        scaler: Any,
        scheduler: Any,
        update_gradients: bool = True,
    ) -> torch.Tensor:
        ctx = self.context
        rack = ctx.raw_model
        assert isinstance(rack, Rack), "the stackwise scope trains a Rack"
        prep = ctx.objective.prepare(training_batch(ctx, batch), ctx.gen)
        t = prep.t if ctx.uses_time else None
        acc = ctx.accelerator
        last = torch.zeros((), device=acc.device)
        with accumulating(ctx, model, update_gradients):
            with acc.autocast():
                h = rack.embed(prep.inputs, t)
            for stack in rack.stacks:
                with acc.autocast():
                    h = rack.run_stacks(h, prep.attention_mask, [stack])
                    loss = ctx.objective.loss(rack.logits(h), prep) * ctx.scale
                acc.backward(loss)  # frees this stack's graph before the next one is built
                h = h.detach()
                last = loss.detach()
        self.record(last)
        if update_gradients:
            self.update(model, optimizer, scheduler)
        return last

    def run(self, plan: Any, data: PreparedData, adapter: ModelAdapter, quiet: bool) -> RunResult:
        return run_end_to_end(self, plan, data, adapter, quiet, " (local loss per stack)")


LocalLosses = LocalLossStrategy
