"""The one Trainer: Accelerate for device, DDP and autocast; our loop for everything else.

Progressive, end-to-end and fine-tuning runs all go through `Trainer.train`. The loop owns its
sampler (a seeded permutation per epoch, sharded by rank) so that the data position is a pair of
integers, which is what exact resume needs. Around the loop: the run dir (run_dir.py), the
checkpoint protocol (checkpointer.py), evaluation (evaluation.py), and extensions, which see the
run through a read-only RunInfo and act through its Control (state.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from stackwise import seeds
from stackwise.config import Config, save_config
from stackwise.errors import StackWiseError
from stackwise.io import checkpoints as ckpt
from stackwise.model.layers import compile_blocks
from stackwise.objectives.base import Objective, random_lengths
from stackwise.train import interrupts
from stackwise.train.adapters import ModelAdapter, RackAdapter
from stackwise.train.checkpointer import Checkpointer
from stackwise.train.evaluation import eval_generator, evaluate_model
from stackwise.train.extensions import HOOKS, Extension, build_extensions, builtin_extensions
from stackwise.train.hardware import average_gradients, keep_freed_memory, make_accelerator
from stackwise.train.interrupts import StopSignals, TrainingInterrupted, stop_signals
from stackwise.train.metrics import LossWindow, logging_extensions
from stackwise.train.optim import (
    build_optimizer,
    build_param_groups,
    build_scheduler,
    logged_lrs,
)
from stackwise.train.run_dir import claim_output_dir, run_dir_of
from stackwise.train.sampler import batch_stream, epoch_loader, stream_loader, training_sampler
from stackwise.train.state import Control, RunInfo, Stage, TrainState

Scheduler = Any  # a torch LR scheduler
Writer = Callable[[Path], None] | None  # writes more final files into the folder it is given


class Trainer:
    # False: the model is not wrapped in DDP and the subclass syncs gradients itself
    wrap_model = True

    def __init__(
        self,
        config: Config,
        model: nn.Module,
        objective: Objective,
        train_data: Dataset,
        val_data: Dataset | None = None,
        output_dir: str | Path | None = None,
        accelerator: Accelerator | None = None,
        param_groups: dict[str, list[tuple[str, nn.Parameter]]] | None = None,
        extensions: list[Extension] | None = None,
        stage: Stage | None = None,
        eval_objective: Objective | None = None,
        eval_seed: int | None = None,
        scheduler: Callable[[Any], Scheduler] | None = None,
        adapter: ModelAdapter | None = None,
    ) -> None:
        """`stage` labels a progressive stage; evaluation scores `eval_objective` (default: the
        training one; a depth-mapped stage trains on part of the noise range but is scored on
        all of it) with masks seeded by `eval_seed` (default train.seed), so the stages of one
        run score the same inputs. `scheduler(optimizer)` replaces the config's LR schedule;
        `adapter` says how a batch becomes the model's loss (default: the rack's)."""
        self.config, self.adapter = config, adapter or RackAdapter()
        tc = config.train
        user_extensions = build_extensions(tc.enabled_extensions)  # unknown names: fail first
        self.accelerator = acc = accelerator or make_accelerator(tc.mixed_precision)
        if acc.device.type == "cpu":
            keep_freed_memory()
        self.output_dir = claim_output_dir(acc, config, run_dir_of(config, output_dir))
        self.objective, self.eval_objective = objective, eval_objective or objective
        self.eval_seed = tc.seed if eval_seed is None else eval_seed
        self.train_data, self.val_data = train_data, val_data
        self.sampler = training_sampler(train_data, tc, acc.process_index, acc.num_processes)
        self._prepare(model, param_groups, scheduler)
        self.state = TrainState()
        self.uses_time = bool(getattr(self.raw_model, "uses_time", False))
        self.control = Control()
        self.checkpointer = Checkpointer(acc, self.output_dir, tc.save_total_limit)
        self.greater_is_better = tc.best_is_greater()
        builtin = logging_extensions(config) + builtin_extensions(config)
        self.extensions = builtin + user_extensions + (extensions or [])
        self.stage = stage or Stage()
        self.run_info = RunInfo(
            config,
            lambda: self.state,
            self.output_dir,
            acc.is_main_process,
            self.greater_is_better,
            self.stage,
            self.extensions,
            self.control,
            self.logger_note,
            lambda: self.raw_model,
        )
        self.gen = torch.Generator(device=acc.device)

    def _prepare(
        self,
        model: nn.Module,
        param_groups: dict[str, list[tuple[str, nn.Parameter]]] | None,
        scheduler: Callable[[Any], Scheduler] | None,
    ) -> None:
        """The optimizer over the parameter groups, the model and optimizer handed to
        Accelerate (DDP unless wrap_model is False), and the LR schedule."""
        tc, acc = self.config.train, self.accelerator
        groups = param_groups if param_groups is not None else self.adapter.named_groups(model)
        opt = build_optimizer(build_param_groups(groups, tc, self.adapter.group_lr), tc)
        self.raw_model = model
        if tc.compile:
            model = self.adapter.compile(model)
        if self.wrap_model:
            self.model, self.optimizer = acc.prepare(model, opt)
        else:
            self.model = model.to(acc.device)
            self.optimizer = acc.prepare(opt)
        inner = self.optimizer.optimizer
        self.scheduler = scheduler(inner) if scheduler else build_scheduler(inner, tc)

    # read-only views of run state, for callers that knew them as attributes
    skipped_steps = property(lambda self: self.state.skipped_steps)
    last_train_loss = property(lambda self: self.state.last_train_loss)
    resumed_from = property(lambda self: self.run_info.resumed_from)

    # -- data -------------------------------------------------------------------------------

    def _loader(self, start: int) -> DataLoader:
        tc, acc, workers = self.config.train, self.accelerator, self.config.data.num_workers
        loading = (tc.batch_size, workers, tc.seed)
        if self.sampler is None:  # a stream goes on from its recorded position
            shard, at = (acc.process_index, acc.num_processes), self.state.stream_position
            return stream_loader(self.train_data, at, shard, loading, self.state.epoch)
        return epoch_loader(self.train_data, self.sampler, self.state.epoch, start, loading)

    def _batches(self) -> Iterator[dict[str, torch.Tensor]]:
        return batch_stream(self._loader, self.state, self.accelerator.device)

    # -- steps ------------------------------------------------------------------------------

    def _seed_gen(self, *parts: int) -> torch.Generator:
        return self.gen.manual_seed(seeds.step_draws(self.config.train.seed, *parts))

    def training_batch(
        self, batch: dict[str, torch.Tensor], gen: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """The batch as training sees it: some rows cut short (objective.random_length_ratio)."""
        ratio = self.config.objective.random_length_ratio
        pad_id = self.objective.specials.pad_id
        if ratio <= 0 or pad_id is None:
            return batch
        return random_lengths(batch, ratio, pad_id, gen)

    def compute_loss(self, batch: dict[str, torch.Tensor], gen: torch.Generator) -> torch.Tensor:
        batch = self.training_batch(batch, gen)
        return self.adapter.loss(self.model, self.objective, batch, gen, self.uses_time)

    def micro_step(
        self, batch: dict[str, torch.Tensor], gen: torch.Generator, scale: float
    ) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns the detached, scaled loss."""
        loss = self.compute_loss(batch, gen) * scale
        self.accelerator.backward(loss)
        return loss.detach()

    def train_step(self, batches: Iterator[dict[str, torch.Tensor]]) -> torch.Tensor | None:
        """One optimizer step; None when a non-finite loss/gradient was skipped."""
        tc, acc = self.config.train, self.accelerator
        if not self.model.training:
            self.model.train()
        total = torch.zeros((), device=acc.device)
        micros = [next(batches) for _ in range(tc.grad_accum_steps)]
        scales = self.adapter.micro_scales(micros, acc)
        for micro, (batch, scale) in enumerate(zip(micros, scales, strict=True)):
            self.state.tokens_seen += batch["input_ids"].numel() * acc.num_processes
            gen = self._seed_gen(self.state.step, micro, acc.process_index)
            last = micro == tc.grad_accum_steps - 1
            ctx = contextlib.nullcontext() if last else acc.no_sync(self.model)
            with ctx:
                total += self.micro_step(batch, gen, scale)
        self.sync_gradients()
        norm = None
        if tc.max_grad_norm > 0:
            norm = acc.clip_grad_norm_(self.model.parameters(), tc.max_grad_norm)
        # NaN/inf in the loss or the gradient norm (inf * 0 is NaN) poisons this sum
        check = total.detach().float() + (norm.detach().float() * 0 if norm is not None else 0)
        # fp16 (GPU): the GradScaler skips overflowing steps itself and adapts its scale
        finite = acc.scaler is not None or bool(torch.isfinite(acc.reduce(check, "sum")))
        if not finite:  # every rank decides alike
            self.optimizer.zero_grad(set_to_none=True)
            self.state.step += 1
            if not tc.skip_nonfinite_steps:
                raise StackWiseError(
                    f"The training loss or gradient became NaN/inf at step {self.state.step}; "
                    "no update was applied and nothing after the last checkpoint was saved. "
                    "Lower train.lr, keep train.max_grad_norm > 0, use mixed_precision bf16/no, "
                    "or set train.skip_nonfinite_steps: true to skip such steps."
                )
            self.state.skipped_steps += 1
            self.scheduler.step()  # keep the schedule aligned with the step count
            return None
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        return total

    def sync_gradients(self) -> None:
        """Average gradients over ranks by hand when the model is not DDP-wrapped."""
        if not self.wrap_model:
            average_gradients(self.raw_model, self.accelerator)

    def evaluate(self) -> dict[str, float]:
        """Loss, perplexity (or the NELBO bound) and masked-token accuracy on fixed batches."""
        acc, tc = self.accelerator, self.config.train
        own = self.adapter.evaluate(self.model, self.val_data, acc, tc)
        out = (
            own
            if own is not None
            else evaluate_model(
                self.model,
                self.eval_objective,
                self.val_data,
                self.accelerator,
                self.config.train,
                self.uses_time,
                seed_gen=lambda i: eval_generator(
                    self.gen, self.eval_seed, i, self.accelerator.process_index
                ),
            )
        )
        self.model.train()
        return out

    # -- loop -------------------------------------------------------------------------------

    def call_hook(self, hook: str, *args: Any) -> None:
        assert hook in HOOKS
        for ext in self.extensions:
            getattr(ext, hook)(self.run_info, *args)

    def logger_note(self, message: str) -> None:
        """A one-line notice (early stop, new best) on the main process."""
        if self.accelerator.is_main_process:
            tqdm.write(message)

    def _eval_and_log(self) -> dict[str, float]:
        metrics = self.evaluate()
        self.state.last_eval_step = self.state.step
        if metrics:
            self.call_hook("on_log", {f"val/{k}": v for k, v in metrics.items()})
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
        tc = self.config.train
        with stop_signals(announce=self.accelerator.is_main_process) as signals:
            if tc.resume_from_checkpoint:
                spec = tc.resume_from_checkpoint
                self.load_checkpoint(ckpt.resolve_checkpoint(spec, self.output_dir))
            batches = self._batches()
            self.call_hook("on_train_begin")
            try:
                if self.state.resumed_from is None:
                    self._eval_and_log()
                self._loop(batches, LossWindow(self.accelerator, self.state.tokens_seen), signals)
                if self.state.last_eval_step != self.state.step:
                    self._eval_and_log()
            except BaseException:
                self.finish()
                raise
        if not self.stage.defer_finish:
            self.finish()
        return self.state

    def _loop(self, batches: Iterator[dict], window: LossWindow, signals: StopSignals) -> None:
        """Steps to max_steps; a stop signal ends it after a full step and a checkpoint."""
        tc, lc = self.config.train, self.config.logging
        while self.state.step < tc.max_steps and not self.control.should_stop:
            self.call_hook("on_step_begin")
            window.add(self.train_step(batches))
            self.call_hook("on_step_end")
            step = self.state.step
            if (step % lc.log_every == 0 or step == tc.max_steps) and window.steps:
                mean, tps = window.close(self.state.tokens_seen)
                self.state.last_train_loss = mean
                metrics = {
                    "train/loss": mean,
                    **logged_lrs(self.optimizer, self.scheduler),
                    "train/tokens_per_s": tps,
                }
                metrics |= self.adapter.step_metrics(self.raw_model)
                if self.state.skipped_steps:
                    metrics["train/skipped_steps"] = self.state.skipped_steps
                self.call_hook("on_log", metrics)
            if step % tc.eval_every == 0 and step != tc.max_steps:
                self._eval_and_log()
            if tc.save_steps and step % tc.save_steps == 0:
                self.save_checkpoint()
            if interrupts.any_rank_signalled(self.accelerator, signals) and step < tc.max_steps:
                name = signals.received or "SIGTERM"  # a peer rank's signal
                path = self.save_checkpoint()
                raise TrainingInterrupted(name, step, path, self.output_dir)

    def finish(self) -> None:
        """End of the run for every extension: loggers flush and close (once)."""
        if not getattr(self, "_finished", False):
            self._finished = True
            if self.config.train.compile:  # the trained model runs eager from here on
                compile_blocks(self.raw_model, on=False)
            self.call_hook("on_train_end")

    # -- checkpoints ----------------------------------------------------------------------------

    def unwrapped(self) -> nn.Module:
        """The model itself, out of its DDP/FSDP wrapper and compiled form: what is saved."""
        model = self.accelerator.unwrap_model(self.model)
        return getattr(model, "_orig_mod", model)

    def _checkpointed(self) -> nn.Module:
        model = self.unwrapped()
        return model.checkpoint_module() if hasattr(model, "checkpoint_module") else model

    def save_checkpoint(self) -> Path:
        """outputs/<run>/checkpoint-<step>, atomically; see stackwise.train.checkpointer."""
        protected = set().union(*(e.protected_checkpoints() for e in self.extensions))
        path, fresh = self.checkpointer.save(self.state.step, self._write_checkpoint, protected)
        if fresh:
            self.call_hook("on_save", path)
        return path

    def _write_checkpoint(self, folder: Path) -> None:
        self.adapter.save(self._checkpointed(), folder)
        torch.save(self.optimizer.state_dict(), folder / "optimizer.bin")
        torch.save(self.scheduler.state_dict(), folder / "scheduler.bin")
        if self.accelerator.scaler is not None:
            torch.save(self.accelerator.scaler.state_dict(), folder / "scaler.bin")
        save_config(self.config, folder / "config.yaml")
        (folder / ckpt.STATE).write_text(json.dumps(self.state_dict(), indent=1))

    def state_dict(self) -> dict[str, Any]:
        """trainer_state.json: the run state, plus what extensions report and keep."""
        out: dict[str, Any] = {"best_metric": None}
        for ext in self.extensions:  # first: a report never overwrites the run state
            out.update(ext.report())
        out.update(self.state.state_dict())
        out["world_size"] = self.accelerator.num_processes
        out["stack_index"] = self.stage.index
        out["extensions"] = {e.name: e.state_dict() for e in self.extensions}
        return out

    def load_checkpoint(self, path: Path) -> None:
        """Weights, optimizer, scheduler, sampler position, RNG and extension states."""
        acc, cp = self.accelerator, self.checkpointer
        saved = cp.read_state(path)
        if note := ckpt.check_resume_config(path, self.config, int(saved.get("step", 0))):
            self.logger_note(note)
        self.adapter.load_weights(self._checkpointed(), path)
        self.optimizer.load_state_dict(ckpt.load_bin(path / "optimizer.bin"))
        self.scheduler.load_state_dict(ckpt.load_bin(path / "scheduler.bin"))
        if acc.scaler is not None and (path / "scaler.bin").is_file():
            acc.scaler.load_state_dict(ckpt.load_bin(path / "scaler.bin"))
        self.state = TrainState.from_dict({**saved, "resumed_from": str(path)})
        cp.saved_steps = {self.state.step}
        states = saved.get("extensions", {})
        for ext in self.extensions:
            if ext.name in states:
                ext.load_state_dict(states[ext.name])
                ext.on_resume(self.run_info)
        cp.read_rng(path)
        self.logger_note(f"resumed from {path} at step {self.state.step}")

    # -- saving -----------------------------------------------------------------------------

    def save(self, tokenizer: Any = None, weights: bool = True, also: Writer = None) -> Path:
        """Weights, config.yaml, tokenizer/, history.json, `also`'s files: staged (io.final)."""
        from stackwise.train.checkpointer import save_finished

        save_finished(self, tokenizer, weights, also)
        return self.output_dir
