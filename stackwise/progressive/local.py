"""end_to_end with scope `stackwise`: every stack trains at once on its own, detached loss.

Stack i reads stack i-1's output detached, and is scored through the shared norm and head. Each
stack's backward runs before the next stack's forward, so at any moment only one stack's
activations (plus the head's) are alive: peak activation memory is about one stack's, not the
rack's. The reported loss is the last stack's, i.e. the loss of the whole rack's prediction.
"""

from __future__ import annotations

import torch

from stackwise.model.rack import Rack
from stackwise.train.trainer import Trainer


class LocalLossTrainer(Trainer):
    # several backward passes per step do not fit DDP's one-backward contract, so gradients
    # are averaged over ranks by hand (stackwise.train.hardware.average_gradients)
    wrap_model = False

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        if self.accelerator.num_processes > 1:  # without DDP, start every rank from rank 0
            import torch.distributed as dist

            with torch.no_grad():
                for p in self.raw_model.parameters():
                    dist.broadcast(p.data, src=0)

    def micro_step(
        self, batch: dict[str, torch.Tensor], gen: torch.Generator, scale: float
    ) -> torch.Tensor:
        rack = self.raw_model
        assert isinstance(rack, Rack), "the stackwise scope trains a Rack"
        prep = self.objective.prepare(self.training_batch(batch, gen), gen)
        t = prep.t if self.uses_time else None
        acc = self.accelerator
        last = torch.zeros((), device=acc.device)
        with acc.autocast():
            h = rack.embed(prep.inputs, t)
        for stack in rack.stacks:
            with acc.autocast():
                h = rack.run_stacks(h, prep.attention_mask, [stack])
                loss = self.objective.loss(rack.logits(h), prep) * scale
            acc.backward(loss)  # frees this stack's graph before the next one is built
            h = h.detach()
            last = loss.detach()
        return last
