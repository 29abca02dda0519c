"""The TrainingStrategy (seed 002's name): what trains when, and the step.

`train_step(model, batch, optimizer, scaler, scheduler, update_gradients=True)` is the step
function: the forward and backward of one micro-batch and, when `update_gradients` is set, the
optimizer update. The Trainer calls it once per micro-batch (gradient accumulation) and never
knows what it does; a strategy changes training by overriding it, not by subclassing the
Trainer. What the step needs from its run (accelerator, objective, model adapter, parallelizer,
the micro-batch's seeded generator and loss scale) comes bound as a `StepContext`.

The recipes that drive whole runs (standard, local losses, progressive) are the registered
strategies of `stackwise.strategies`; their `run` builds Trainers around this step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from stackwise.errors import StackWiseError
from stackwise.objectives.base import Objective, random_lengths
from stackwise.registry import Registry
from stackwise.train import finite
from stackwise.train.finite import PendingVerdicts

Batch = dict[str, torch.Tensor]


@dataclass
class StepContext:
    """One run's view for its steps. The Trainer fills `gen`, `scale` and `step` before each
    micro-batch; the strategy adds to `step_loss` and sets `updated` after an update."""

    accelerator: Any
    adapter: Any  # the ModelAdapter: how a batch becomes the model's loss
    objective: Objective
    train: Any  # the TrainSpec: clipping, skipping non-finite steps
    parallelizer: Any  # syncs gradients where the model is not wrapped
    raw_model: nn.Module
    uses_time: bool = False
    length_ratio: float = 0.0  # objective.random_length_ratio
    gen: torch.Generator | None = None
    scale: float = 1.0
    step: int = 0
    step_loss: torch.Tensor | None = field(default=None, repr=False)
    # set by `TrainingStrategy.update`: False when a non-finite step was skipped; a step
    # function that updates on its own may leave it None (counted as an update), as does an
    # update whose verdict stays on the device: then `nonfinite` holds it (a 0-d bool tensor,
    # true for a skipped step), which `settle` reads later
    updated: bool | None = None
    nonfinite: torch.Tensor | None = field(default=None, repr=False)
    verdicts: PendingVerdicts = field(default_factory=PendingVerdicts, repr=False)
    late_skips: int = 0  # steps `settle` found skipped, not yet counted by the Trainer

    def begin_step(self, step: int) -> None:
        self.step, self.updated, self.nonfinite = step, None, None
        self.step_loss = torch.zeros((), device=self.accelerator.device)

    def take_late_skips(self) -> int:
        count, self.late_skips = self.late_skips, 0
        return count


class TrainingStrategy:
    """The standard step: one loss over the whole model. Override `train_step` (or
    `compute_loss`) for another algorithm; `run` is what a registered strategy does with a
    whole config (see stackwise.strategies)."""

    name = "strategy"

    def __init__(self, config: Any = None, logger: Any = None) -> None:
        self.config, self.logger = config, logger
        self.ctx: StepContext | None = None

    def prepare_model(self, model: nn.Module, adapter: Any) -> None:
        """Before the model is placed and its optimizer made: what this algorithm trains
        (fine-tuning freezes the base here); by default the model as it is."""

    def bind(self, ctx: StepContext) -> None:
        self.ctx = ctx

    @property
    def context(self) -> StepContext:
        if self.ctx is None:
            raise RuntimeError("the strategy is not bound to a run: build it into a Trainer")
        return self.ctx

    def train_step(
        self,
        model: nn.Module,
        batch: Batch,
        optimizer: Any,
        scaler: Any,
        scheduler: Any,
        update_gradients: bool = True,
    ) -> torch.Tensor:
        """Forward and backward of `batch`; with `update_gradients`, clip and step. Returns the
        micro-batch's detached, scaled loss. (`scaler`: Accelerate applies it in backward and
        in the optimizer's step, so the standard step needs it only to know it is there.)"""
        ctx = self.context
        with accumulating(ctx, model, update_gradients):
            loss = self.compute_loss(model, batch) * ctx.scale
            if steps_itself(ctx):  # DeepSpeed: its engine counts the micro-batches
                ctx.parallelizer.backward(model, loss, update_gradients)
            else:
                ctx.accelerator.backward(loss)
        self.record(loss)
        if update_gradients:
            self.update(model, optimizer, scheduler)
        return loss.detach()

    def compute_loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        ctx = self.context
        batch = training_batch(ctx, batch)
        return ctx.adapter.loss(model, ctx.objective, batch, ctx.gen, ctx.uses_time)

    def record(self, loss: torch.Tensor) -> None:
        ctx = self.context
        if ctx.step_loss is not None:
            ctx.step_loss += loss.detach()

    def update(self, model: nn.Module, optimizer: Any, scheduler: Any) -> None:
        """Sync (where unwrapped), clip, and step, unless the loss or gradient is NaN/inf:
        then no update, and either the step is skipped or the run stops with a clear error."""
        ctx, tc, acc = self.context, self.context.train, self.context.accelerator
        ctx.parallelizer.sync_gradients(ctx.raw_model, acc)
        norm = None
        if tc.max_grad_norm > 0 and not steps_itself(ctx):  # an engine clips on its own
            norm = acc.clip_grad_norm_(model.parameters(), tc.max_grad_norm)
            if hasattr(norm, "full_tensor"):  # sharded gradients (FSDP2): the whole norm
                norm = norm.full_tensor()
        loss = ctx.step_loss if ctx.step_loss is not None else torch.zeros((), device=acc.device)
        # NaN/inf in the loss or the gradient norm (inf * 0 is NaN) poisons this sum
        check = loss.detach().float() + (norm.detach().float() * 0 if norm is not None else 0)
        if (
            acc.scaler is None
            and not steps_itself(ctx)
            and finite.verdict_stays_on_device(optimizer, acc.device)
        ):
            bad = ~torch.isfinite(acc.reduce(check, "sum"))  # every rank decides alike
            self.settle()  # the previous step's verdict, long computed by now
            ctx.verdicts.step(optimizer, bad, ctx.step)  # a NaN/inf step changes nothing
            ctx.nonfinite = bad
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            return
        # fp16 (GPU): the GradScaler skips overflowing steps itself and adapts its scale
        sound = acc.scaler is not None or bool(torch.isfinite(acc.reduce(check, "sum")))
        if not sound:  # every rank decides alike
            optimizer.zero_grad(set_to_none=True)
            if not tc.skip_nonfinite_steps:
                raise nonfinite_error(ctx.step)
            scheduler.step()  # keep the schedule aligned with the step count
            ctx.updated = False
            return
        applied = optimizer.step()  # an engine (DeepSpeed) says whether it stepped
        if applied is False:
            raise StackWiseError(
                f"The gradient became NaN/inf at step {ctx.step + 1} and DeepSpeed's engine "
                "skipped the update; nothing after the last checkpoint was saved. Lower "
                "train.lr, keep train.max_grad_norm > 0, or use mixed_precision bf16/no."
            )
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        ctx.updated = True

    def settle(self) -> None:
        """Read the verdicts the device still holds (`update` with a fused optimizer): each
        NaN/inf step, whose update the optimizer skipped, is counted in `late_skips`, or stops
        the run unless train.skip_nonfinite_steps."""
        ctx = self.context
        skipped = ctx.verdicts.read()
        if skipped and not ctx.train.skip_nonfinite_steps:
            raise nonfinite_error(skipped[0])
        ctx.late_skips += len(skipped)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"strategy '{self.name}' defines a step but no run; register a recipe in "
            "stackwise.strategies to train whole configs with it"
        )


def nonfinite_error(step: int) -> StackWiseError:
    """The run stops at a NaN/inf step (0-based `step`), whose update was not applied."""
    return StackWiseError(
        f"The training loss or gradient became NaN/inf at step {step + 1}; no update was "
        "applied and nothing after the last checkpoint was saved. Lower train.lr, keep "
        "train.max_grad_norm > 0, use mixed_precision bf16/no, or set "
        "train.skip_nonfinite_steps: true to skip such steps."
    )


def steps_itself(ctx: StepContext) -> bool:
    """The parallelizer's engine runs backward, accumulation and clipping (DeepSpeed)."""
    return bool(getattr(ctx.parallelizer, "steps_itself", False))


def accumulating(ctx: StepContext, model: nn.Module, last: bool) -> Any:
    """Gradients of a micro-batch that is not the step's last stay local (no all-reduce)."""
    if last or ctx.accelerator.num_processes == 1 or steps_itself(ctx):
        return contextlib.nullcontext()
    # FSDP2 reduce-scatters every micro-batch (it has no no_sync): its gradients stay sharded
    return ctx.accelerator.no_sync(model)


def training_batch(ctx: StepContext, batch: Batch) -> Batch:
    """The batch as training sees it: some rows cut short (objective.random_length_ratio)."""
    pad_id = ctx.objective.specials.pad_id
    if ctx.length_ratio <= 0 or pad_id is None or ctx.gen is None:
        return batch
    return random_lengths(batch, ctx.length_ratio, pad_id, ctx.gen)


STRATEGY_FAMILY: Registry[TrainingStrategy] = Registry(
    "training strategy",
    "register_training_strategy",
    # a parallelizer whose placement the step needs (local losses: an unwrapped model)
    defaults={"parallelizer": None},
)
register_training_strategy = STRATEGY_FAMILY.register
