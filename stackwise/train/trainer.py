"""The EnhancedTrainer (seed 002's name; `Trainer` is the same class): the one training loop.

Progressive stages, end-to-end runs and fine-tuning all run through it. It coordinates parts
that builders make and hand in (stackwise.train.builders), and knows none of their kinds:

- the ModelAdapter says how a batch becomes the model's loss and how weights are saved;
- the TrainingStrategy's `train_step` is the step (standard, local losses, a user's own);
- the Placement is the model where it trains, with its optimizer and LR schedule;
- the TrainingData gives batches from the run state's position; the Evaluator scores;
- the ExtensionManager calls the extensions' hooks, which see a read-only RunInfo;
- the CheckpointManager saves and restores; the MetricsLogger takes every logged row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from stackwise import seeds
from stackwise.io import checkpoints as ckpt
from stackwise.model.compiled import compile_blocks
from stackwise.train import interrupts
from stackwise.train.checkpoint_manager import CheckpointManager
from stackwise.train.evaluation import Evaluator
from stackwise.train.extensions import ExtensionManager
from stackwise.train.flops import FlopMeter, run_compute
from stackwise.train.interrupts import StopSignals, TrainingInterrupted, stop_signals
from stackwise.train.metrics import LossWindow, MetricsLogger
from stackwise.train.optim import logged_lrs
from stackwise.train.peak_memory import peak_memory
from stackwise.train.placement import Placement
from stackwise.train.sampler import TrainingData
from stackwise.train.settings_call import FromSettings
from stackwise.train.state import Control, Live, RunInfo, Stage, TrainState
from stackwise.train.strategy import TrainingStrategy
from stackwise.train.trainer_files import RunFiles

Batches = Iterator[dict[str, torch.Tensor]]


@dataclass
class RunData:
    """What the loop reads: training batches and the evaluator of the validation data."""

    train: TrainingData
    evaluator: Evaluator


class EnhancedTrainer(FromSettings, RunFiles):
    # what a finished train() saves, when the Trainer saves its own run (one built from
    # settings: stackwise.fronts.trainer); recipes that save themselves leave it None
    save_when_trained: Callable[[], Any] | None = None

    def __init__(
        self,
        plan: Any = None,
        model_adapter: Any = None,
        training_strategy: TrainingStrategy | None = None,
        placement: Placement | None = None,
        data: RunData | None = None,
        extension_manager: ExtensionManager | None = None,
        checkpoint_manager: CheckpointManager | None = None,
        metrics_logger: MetricsLogger | None = None,
        stage: Stage | None = None,
        **settings: Any,
    ) -> None:
        """`plan`: the run's specs; `stage` labels a progressive stage (defer_finish keeps its
        loggers open until `finish()`, after its stack's own report). A call from settings
        (stackwise.train.settings_call) was built whole by `__new__`: nothing is left to do."""
        if placement is None:
            return
        if settings:
            raise TypeError(f"EnhancedTrainer got unexpected keywords {sorted(settings)}")
        assert data is not None and training_strategy is not None
        assert extension_manager and checkpoint_manager and metrics_logger
        self.plan, self.adapter, self.strategy = plan, model_adapter, training_strategy
        self.placement, self.data = placement, data
        self.extensions, self.checkpoints = extension_manager, checkpoint_manager
        self.metrics, self.stage = metrics_logger, stage or Stage()
        acc = placement.accelerator
        self.live = Live(TrainState(), lambda: self.placement.raw_model)
        self.control = Control()
        self.run_info = RunInfo(
            plan=plan,
            output_dir=checkpoint_manager.output_dir,
            is_main=acc.is_main_process,
            greater_is_better=plan.train.best_is_greater(),
            stage=self.stage,
            extensions=tuple(extension_manager.extensions),
            control=self.control,
            note=self.logger_note,
            sinks=tuple(metrics_logger.sinks),
            live=self.live,
        )
        self.extensions.bind(self.run_info)
        self.gen = torch.Generator(device=acc.device)
        self.flop_meter = FlopMeter(placement.raw_model)

    # read-only views, for callers that knew them as attributes
    accelerator = property(lambda self: self.placement.accelerator)
    model = property(lambda self: self.placement.model)
    raw_model = property(lambda self: self.placement.raw_model)
    optimizer = property(lambda self: self.placement.optimizer)
    scheduler = property(lambda self: self.placement.scheduler)
    output_dir = property(lambda self: self.checkpoints.output_dir)
    config = property(lambda self: self.plan)
    objective = property(lambda self: self.strategy.context.objective)
    skipped_steps = property(lambda self: self.state.skipped_steps)
    last_train_loss = property(lambda self: self.state.last_train_loss)
    resumed_from = property(lambda self: self.run_info.resumed_from)
    greater_is_better = property(lambda self: self.run_info.greater_is_better)

    @property
    def state(self) -> TrainState:
        return self.live.state

    def unwrapped(self) -> nn.Module:
        return self.placement.unwrapped()

    def initialize_model(self) -> nn.Module:
        """The model as built for this run (seed 002's name): the adapter's, with the layers
        its extensions add (memory) and the adapters it trains, on the run's device."""
        return self.placement.raw_model

    # -- steps ------------------------------------------------------------------------------

    def batches(self) -> Batches:
        return self.data.train.batches(self.state, self.accelerator.device)

    def seeded(self, *parts: int) -> torch.Generator:
        """The generator of one micro-batch's draws (masks, noise levels, cut lengths)."""
        return self.gen.manual_seed(seeds.step_draws(self.plan.train.seed, *parts))

    def optimizer_step(self, batches: Batches) -> torch.Tensor | None:
        """One optimizer step over train.grad_accum_steps micro-batches, each through the
        strategy's train_step: the step's loss, or None when a non-finite loss/gradient was
        skipped. On a GPU with the fused AdamW that verdict stays on the device: the loss
        comes back as computed and `strategy.context.nonfinite` holds the verdict."""
        acc, p, ctx = self.accelerator, self.placement, self.strategy.context
        if not p.model.training:
            p.model.train()
        n = self.plan.train.grad_accum_steps
        micros = [next(batches) for _ in range(n)]
        scales = self.adapter.micro_scales(micros, acc)
        ctx.begin_step(self.state.step)
        total = torch.zeros((), device=acc.device)
        spent = self.flop_meter.total
        with self.flop_meter.counting():
            for micro, (batch, scale) in enumerate(zip(micros, scales, strict=True)):
                self.state.tokens_seen += batch["input_ids"].numel() * acc.num_processes
                ctx.gen, ctx.scale = self.seeded(self.state.step, micro, acc.process_index), scale
                last = micro == n - 1
                s = self.strategy
                total += s.train_step(p.model, batch, p.optimizer, acc.scaler, p.scheduler, last)
        self.state.flops += (self.flop_meter.total - spent) * acc.num_processes
        self.state.step += 1
        self.state.skipped_steps += ctx.take_late_skips()  # earlier steps, read in this one
        if ctx.updated is False:  # the strategy skipped a non-finite step
            self.state.skipped_steps += 1
            return None
        return total

    def settle_steps(self) -> None:
        """Count the skipped steps whose verdict the device still held (or stop at one, see
        TrainingStrategy.settle): before anything is logged, evaluated or saved."""
        self.strategy.settle()
        self.state.skipped_steps += self.strategy.context.take_late_skips()

    def evaluate(self) -> dict[str, float]:
        """Loss, perplexity (or the NELBO bound) and masked-token accuracy on fixed batches."""
        return self.data.evaluator.evaluate(
            self.model, self.accelerator, self.strategy.context.uses_time
        )

    # -- loop -------------------------------------------------------------------------------

    def call_hook(self, hook: str, *args: Any) -> None:
        self.extensions.call(hook, *args)

    def log(self, metrics: dict[str, Any]) -> None:
        """A row to the metrics, then to the extensions that watch them."""
        self.metrics.log(metrics)
        self.call_hook("on_log", metrics)

    def logger_note(self, message: str) -> None:
        """A one-line notice (early stop, new best) on the main process."""
        if self.accelerator.is_main_process:
            tqdm.write(message)

    def _eval_and_log(self) -> dict[str, float]:
        metrics = self.evaluate()
        self.state.last_eval_step = self.state.step
        if metrics:
            self.log(
                {f"val/{k}": v for k, v in metrics.items()} | run_compute(self.stage, self.state)
            )
            self.state.history.append({"step": self.state.step, **metrics})
            self.call_hook("on_eval", metrics)
            if self.control.should_save:  # after every extension has seen this eval
                self.control.should_save = False
                self.save_checkpoint()
        return metrics

    def train(self) -> TrainState:
        """Run to max_steps. With `stage.defer_finish` the run's loggers stay open (a progressive
        stage reports its stack first) until `finish()`; a failure always finishes. All of it
        runs under the run's stop signals: one that comes before the first step acts after it."""
        tc = self.plan.train
        with stop_signals(announce=self.accelerator.is_main_process) as signals:
            if tc.resume_from_checkpoint:
                spec = tc.resume_from_checkpoint
                self.load_checkpoint(ckpt.resolve_checkpoint(spec, self.output_dir))
            batches = self.batches()
            self.metrics.begin(self.run_info)
            self.write_machine()
            self.call_hook("on_train_begin")
            try:
                if self.state.resumed_from is None:
                    self._eval_and_log()
                self._loop(batches, LossWindow(self.accelerator, self.state.tokens_seen), signals)
                self.settle_steps()  # a run stopped early may end on an unread step
                if self.state.last_eval_step != self.state.step:
                    self._eval_and_log()
            except BaseException:
                self.finish()
                raise
        if not self.stage.defer_finish:
            self.finish()
        if self.save_when_trained is not None:
            self.save_when_trained()
        return self.state

    def _loop(self, batches: Batches, window: LossWindow, signals: StopSignals) -> None:
        """Steps to max_steps; a stop signal ends it after a full step and a checkpoint."""
        tc = self.plan.train
        while self.state.step < tc.max_steps and not self.control.should_stop:
            self.call_hook("on_step_begin")
            window.add(self.optimizer_step(batches), self.strategy.context.nonfinite)
            self.metrics.step_done()
            self.call_hook("on_step_end")
            step = self.state.step
            last = step == tc.max_steps or self.control.should_stop
            logs = step % self.plan.logging.log_every == 0 or step == tc.max_steps
            saves = bool(tc.save_steps) and step % tc.save_steps == 0
            # the last step's eval comes after the loop, unless a checkpoint is due: then
            # first, so that the checkpoint holds it (history, best metric, early stopping)
            evaluates = (step % tc.eval_every == 0 and not last) or (last and saves)
            if logs or evaluates or saves:
                self.settle_steps()
            row = self._train_row(window) if logs and window.steps else None
            if row is not None:
                self.log(row)
            if evaluates:
                self._eval_and_log()
            if saves:
                self.save_checkpoint()
            if interrupts.any_rank_signalled(self.accelerator, signals) and step < tc.max_steps:
                self.settle_steps()
                name = signals.received or "SIGTERM"  # a peer rank's signal
                path = self.save_checkpoint()
                raise TrainingInterrupted(name, step, path, self.output_dir)

    def _train_row(self, window: LossWindow) -> dict[str, Any] | None:
        """The logging window's row: mean loss, tokens seen, LRs, tokens/s, adapter metrics;
        None when every step of the window was skipped (NaN/inf)."""
        mean, tps = window.close(self.state.tokens_seen)
        if mean is None:
            return None
        self.state.last_train_loss = mean
        row = {"train/loss": mean, "train/tokens": self.state.tokens_seen} | run_compute(
            self.stage, self.state
        )
        row |= logged_lrs(self.optimizer, self.scheduler) | {"train/tokens_per_s": tps}
        row |= peak_memory(self.accelerator)
        row |= self.adapter.step_metrics(self.raw_model)
        if self.state.skipped_steps:
            row["train/skipped_steps"] = self.state.skipped_steps
        return row

    def finish(self) -> None:
        """End of the run for every extension and sink: loggers flush and close (once)."""
        if not getattr(self, "_finished", False):
            self._finished = True
            if self.placement.compiling.on:  # the trained model runs eager from here on
                compile_blocks(self.raw_model, on=False)
            if self.placement.restore_outputs is not None:  # and gives fp32 outputs again
                self.placement.restore_outputs()
            self.call_hook("on_train_end")
            self.metrics.close()
            self.flop_meter.detach()


Trainer = EnhancedTrainer
