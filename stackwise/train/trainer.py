"""The one Trainer: Accelerate for device, DDP and autocast; our loop for everything else.

Progressive, end-to-end and fine-tuning runs all go through `Trainer.train`. The loop owns its
sampler (a seeded permutation per epoch, sharded by rank) so that the data position is a pair of
integers, which is what exact resume needs.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler
from tqdm.auto import tqdm

from stackwise.config import Config, save_config
from stackwise.errors import StackWiseError
from stackwise.objectives.base import IGNORE, Objective, random_lengths, real_tokens
from stackwise.train import checkpointing as ckpt
from stackwise.train.extensions import (
    HOOKS,
    BestModel,
    EarlyStopping,
    Extension,
    build_extensions,
)
from stackwise.train.hardware import keep_freed_memory, resolve_precision
from stackwise.train.metrics import logging_extensions
from stackwise.train.optim import build_optimizer, build_param_groups, build_scheduler


class EpochSampler(Sampler[int]):
    """A permutation seeded by (seed, epoch), this rank's share of it, from `start` on."""

    def __init__(
        self,
        n: int,
        seed: int,
        rank: int = 0,
        world: int = 1,
        shuffle: bool = True,
        fixed_shard: bool = False,
    ):
        self.n, self.seed, self.rank, self.world, self.shuffle = n, seed, rank, world, shuffle
        # fixed_shard: each rank always sees the same items (shuffled within), so a per-rank
        # activation cache holds 1/world of the data and keeps hitting across epochs
        self.fixed_shard = fixed_shard
        self.epoch = 0
        self.start = 0

    def order(self) -> list[int]:
        if self.fixed_shard:
            usable = self.n - self.n % self.world
            mine = torch.arange(self.rank, usable, self.world)
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
                mine = mine[torch.randperm(len(mine), generator=g)]
            return mine.tolist()
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
            perm = torch.randperm(self.n, generator=g).tolist()
        else:
            perm = list(range(self.n))
        usable = self.n - self.n % self.world
        return perm[self.rank : usable : self.world]

    def __iter__(self) -> Iterator[int]:
        return iter(self.order()[self.start :])

    def __len__(self) -> int:
        return self.n // self.world - self.start


def default_run_name(config: Config) -> str:
    return f"{config.objective.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def resolve_output_dir(config: Config) -> Path:
    if config.train.output_dir:
        return Path(config.train.output_dir).expanduser()
    name = config.logging.run_name or default_run_name(config)
    return Path("outputs") / name


def prepare_output_dir(path: Path, overwrite: bool, resuming: bool = False) -> None:
    """Refuse to clobber a finished run; check that we can write before any training.

    A run being resumed has stacks and history already (written as stages end); only a final
    model.safetensors marks it finished."""
    finished = ("model.safetensors",)
    if not resuming:
        finished += ("stacks/manifest.json", "progressive_history.json")
    if any((path / f).exists() for f in finished) and not overwrite:
        raise StackWiseError(
            f"Output dir '{path}' already holds a trained model. Choose another "
            "train.output_dir, or set train.overwrite_output_dir=true to replace it."
        )
    unfinished = not resuming and (path / ckpt.LATEST).is_file()
    if unfinished and not overwrite:
        raise StackWiseError(
            f"Output dir '{path}' holds checkpoints of an unfinished run. Resume it with "
            "train.resume_from_checkpoint=latest, choose another train.output_dir, or set "
            "train.overwrite_output_dir=true to start over."
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("ok")
        probe.unlink()
        if unfinished:  # overwrite: the earlier run's checkpoints go first
            ckpt.clear_run(path)
    except OSError as err:
        raise StackWiseError(
            f"Cannot write to output dir '{path}': {err.strerror or err}. Pick a writable "
            "train.output_dir."
        ) from None


def claim_output_dir(acc: Accelerator, config: Config, output_dir: str | Path | None) -> Path:
    """Rank 0 picks the (time-stamped) dir and checks it; every rank gets the same path and
    raises the same verdict, so none waits on a dead peer."""
    shared: list[Any] = [str(output_dir) if output_dir else None, None]
    if acc.is_main_process:
        shared[0] = shared[0] or str(resolve_output_dir(config))
        try:
            prepare_output_dir(
                Path(shared[0]),
                config.train.overwrite_output_dir,
                resuming=config.train.resume_from_checkpoint is not None,
            )
        except StackWiseError as err:
            shared[1] = str(err)
    if acc.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(shared, from_process=0)
    if shared[1] is not None:
        raise StackWiseError(shared[1])
    return Path(shared[0])


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    tokens_seen: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


def eval_generator(gen: torch.Generator, seed: int, batch: int, rank: int) -> torch.Generator:
    """The generator for validation batch `batch`: the same masks at every evaluation."""
    return gen.manual_seed(
        ((seed * 1_000_003 + 99_991) * 1_000_003 + batch * 131 + rank) % (2**63 - 1)
    )


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    objective: Objective,
    val_data: Dataset | None,
    acc: Accelerator,
    tc: Any,
    uses_time: bool,
    seed_gen: Any,
) -> dict[str, float]:
    """Loss, perplexity (or the NELBO bound) and masked-token accuracy on fixed batches.

    The masks come from `seed_gen(batch_index)`, so every evaluation scores the same inputs.
    """
    if val_data is None or len(val_data) == 0:
        return {}
    model.eval()
    loader = DataLoader(
        val_data,
        batch_size=tc.batch_size,
        sampler=EpochSampler(len(val_data), 0, acc.process_index, acc.num_processes, False),
    )
    keys = ("loss_sum", "norm", "nll_sum", "scored", "correct", "nelbo_sum", "bytes", "bytes_all")
    table = getattr(val_data, "bytes_per_token", None)  # text length of each token id
    if table is not None:
        table = table.to(acc.device)
    sums = torch.zeros(len(keys), dtype=torch.float64, device=acc.device)
    for i, batch in enumerate(loader):
        if i >= tc.eval_batches:
            break
        batch = {k: v.to(acc.device) for k, v in batch.items()}
        prep = objective.prepare(batch, seed_gen(i))
        t = prep.t if uses_time else None
        with acc.autocast():
            logits = model(prep.inputs, prep.attention_mask, t)
        part = objective.eval_sums(logits, prep)
        if table is not None:
            part.update(text_bytes(table, batch, prep, objective.specials.pad_id))
        sums += torch.tensor(
            [part.get(k, 0.0) for k in keys], dtype=torch.float64, device=acc.device
        )
    sums = acc.reduce(sums, reduction="sum")
    s = dict(zip(keys, sums.tolist(), strict=True))
    out = {
        "loss": s["loss_sum"] / max(s["norm"], 1.0),
        "accuracy": s["correct"] / max(s["scored"], 1.0),
    }
    if objective.name == "diffusion":
        nelbo = s["nelbo_sum"] / max(s["norm"], 1.0)
        out["nelbo"] = nelbo
        out["ppl_bound"] = math.exp(min(nelbo, 50.0))
        if table is not None:  # a bound on the whole text's log-likelihood, per character
            out["bpc"] = s["nelbo_sum"] / math.log(2) / max(s["bytes_all"], 1.0)
    else:
        out["ppl"] = math.exp(min(s["nll_sum"] / max(s["scored"], 1.0), 50.0))
        if table is not None:  # the scored tokens' log-likelihood, per character they spell
            out["bpc"] = s["nll_sum"] / math.log(2) / max(s["bytes"], 1.0)
    return out


def text_bytes(
    table: torch.Tensor, batch: dict[str, torch.Tensor], prep: Any, pad_id: int | None
) -> dict[str, float]:
    """Characters (UTF-8 bytes) spelled by the scored targets, and by all real tokens."""
    targets = prep.targets
    scored = targets != IGNORE
    ids = batch["input_ids"]
    real = real_tokens(batch, pad_id if pad_id is not None else -1)
    return {
        "bytes": float(table[targets.clamp_min(0)][scored].sum()),
        "bytes_all": float(table[ids][real].sum()),
    }


def make_accelerator(mixed_precision: str) -> Accelerator:
    """An Accelerator with this precision, even if an earlier run in this process used another.

    Accelerate keeps its state in a process-wide singleton; progressive runs and notebooks build
    several trainers, so a precision change resets that state (the process group survives).
    """
    mixed_precision = resolve_precision(mixed_precision)
    if mixed_precision == "fp16" and not torch.cuda.is_available():
        raise StackWiseError(
            "train.mixed_precision=fp16 needs a GPU; on the CPU use bf16 (fp16 is emulated "
            "there and about 100x slower) or no."
        )
    shared = AcceleratorState._shared_state
    if shared and shared.get("_mixed_precision", mixed_precision) != mixed_precision:
        AcceleratorState._reset_state(reset_partial_state=False)
    # Without CUDA, Accelerate only starts DDP (gloo) under torchrun when told it runs on the CPU;
    # otherwise every rank would silently train its own copy.
    return Accelerator(mixed_precision=mixed_precision, cpu=not torch.cuda.is_available())


class Trainer:
    # False: the model is not wrapped in DDP and the subclass syncs gradients itself
    wrap_model = True
    progress_desc = "train"  # progressive stages show "stack 2/4"

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
    ) -> None:
        self.config = config
        tc = config.train
        user_extensions = build_extensions(tc.enabled_extensions)  # unknown names: fail first
        self.accelerator = accelerator or make_accelerator(tc.mixed_precision)
        acc = self.accelerator
        if acc.device.type == "cpu":
            keep_freed_memory()
        resume = tc.resume_from_checkpoint
        if output_dir is None and tc.output_dir is None and resume and resume != "latest":
            output_dir = Path(resume).expanduser().parent  # continue the checkpoint's run
        self.output_dir = claim_output_dir(acc, config, output_dir)
        self.objective = objective
        # what evaluation scores; a depth-mapped stage trains on a noise range but is scored
        # on the full range, so stages are comparable
        self.eval_objective = objective
        self.train_data, self.val_data = train_data, val_data
        if len(train_data) < tc.batch_size * acc.num_processes:
            raise StackWiseError(
                f"The training set has {len(train_data)} sequences, fewer than one batch of "
                f"train.batch_size={tc.batch_size} per process. Lower the batch size or add data."
            )
        groups = param_groups if param_groups is not None else self._groups(model)
        opt = build_optimizer(build_param_groups(groups, tc), tc)
        self.raw_model = model
        if tc.compile:
            model = torch.compile(model)  # type: ignore[assignment]
        if self.wrap_model:
            self.model, self.optimizer = acc.prepare(model, opt)
        else:
            self.model = model.to(acc.device)
            self.optimizer = acc.prepare(opt)
        self.scheduler = build_scheduler(self.optimizer.optimizer, tc)
        self.sampler = EpochSampler(
            len(train_data),
            tc.seed,
            acc.process_index,
            acc.num_processes,
            fixed_shard=bool(getattr(train_data, "fixed_shard", False)),
        )
        self.state = TrainState()
        self.uses_time = bool(getattr(self.raw_model, "uses_time", False))
        self.should_stop = False  # set by extensions (early stopping)
        self.save_requested = False  # set by extensions (best model): saved after on_eval
        self._saved_steps: set[int] = set()
        self.last_eval_step: int | None = None
        self.resumed_from: Path | None = None
        self.skipped_steps = 0
        self.greater_is_better = (
            tc.greater_is_better
            if tc.greater_is_better is not None
            else tc.metric_for_best == "accuracy"
        )
        builtin: list[Extension] = logging_extensions(self)
        if tc.save_best_model:
            builtin.append(BestModel())
        if tc.early_stopping_patience is not None:
            builtin.append(EarlyStopping())
        self.extensions = builtin + user_extensions + (extensions or [])
        self.defer_finish = False  # see train()
        self.gen = torch.Generator(device=acc.device)
        self.last_train_loss: float | None = None
        # evaluation masks depend on this seed only, so stages of one run score the same inputs
        self.eval_seed = tc.seed

    @staticmethod
    def _groups(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
        if hasattr(model, "param_groups"):
            return model.param_groups()
        return {"blocks": list(model.named_parameters())}

    # -- data -------------------------------------------------------------------------------

    def _loader(self, start: int) -> DataLoader:
        self.sampler.epoch = self.state.epoch
        self.sampler.start = start * self.config.train.batch_size
        return DataLoader(
            self.train_data,
            batch_size=self.config.train.batch_size,
            sampler=self.sampler,
            drop_last=True,
            num_workers=self.config.data.num_workers,
            # its own generator: creating an iterator draws a worker seed, which must not move
            # the global RNG (dropout), or a resumed run would diverge from an uninterrupted one
            generator=torch.Generator().manual_seed(self.config.train.seed + self.state.epoch),
        )

    def _batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """Endless batches, tracking (epoch, batch_in_epoch) for resume."""
        dev = self.accelerator.device
        while True:
            for batch in self._loader(self.state.batch_in_epoch):
                self.state.batch_in_epoch += 1
                yield {k: v.to(dev, non_blocking=True) for k, v in batch.items()}
            self.state.epoch += 1
            self.state.batch_in_epoch = 0

    # -- steps ------------------------------------------------------------------------------

    def _seed_gen(self, *parts: int) -> torch.Generator:
        seed = self.config.train.seed
        for p in parts:
            seed = (seed * 1_000_003 + p) % (2**63 - 1)
        return self.gen.manual_seed(seed)

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
        prep = self.objective.prepare(self.training_batch(batch, gen), gen)
        t = prep.t if self.uses_time else None
        # a cache-aware model (progressive stages) also takes the batch's stable keys
        extra = {"cache_key": batch["cache_key"]} if "cache_key" in batch else {}
        logits = self.model(prep.inputs, prep.attention_mask, t, **extra)
        return self.objective.loss(logits, prep)

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
        for micro in range(tc.grad_accum_steps):
            batch = next(batches)
            self.state.tokens_seen += batch["input_ids"].numel() * acc.num_processes
            gen = self._seed_gen(self.state.step, micro, acc.process_index)
            last = micro == tc.grad_accum_steps - 1
            ctx = contextlib.nullcontext() if last else acc.no_sync(self.model)
            with ctx:
                total += self.micro_step(batch, gen, 1.0 / tc.grad_accum_steps)
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
            self.skipped_steps += 1
            self.scheduler.step()  # keep the schedule aligned with the step count
            return None
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step += 1
        return total

    def sync_gradients(self) -> None:
        """Average gradients over ranks by hand when the model is not DDP-wrapped."""
        acc = self.accelerator
        if self.wrap_model or acc.num_processes == 1:
            return
        import torch.distributed as dist

        for p in self.raw_model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= acc.num_processes

    def evaluate(self) -> dict[str, float]:
        """Loss, perplexity (or the NELBO bound) and masked-token accuracy on fixed batches."""
        out = evaluate_model(
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
        self.model.train()
        return out

    # -- loop -------------------------------------------------------------------------------

    def _call(self, hook: str, *args: Any) -> None:
        assert hook in HOOKS
        for ext in self.extensions:
            getattr(ext, hook)(self, *args)

    def logger_note(self, message: str) -> None:
        """A one-line notice (early stop, new best) on the main process."""
        if self.accelerator.is_main_process:
            tqdm.write(message)

    def _eval_and_log(self) -> dict[str, float]:
        metrics = self.evaluate()
        self.last_eval_step = self.state.step
        if metrics:
            self._call("on_log", {f"val/{k}": v for k, v in metrics.items()})
            self.state.history.append({"step": self.state.step, **metrics})
            self._call("on_eval", metrics)
            if self.save_requested:  # after every extension has seen this eval
                self.save_requested = False
                self.save_checkpoint()
        return metrics

    def train(self) -> TrainState:
        """Run to max_steps. With `defer_finish` set the run's loggers stay open (a progressive
        stage reports its stack first) until `finish()`; a failure always finishes."""
        tc, lc = self.config.train, self.config.logging
        if tc.resume_from_checkpoint:
            spec = tc.resume_from_checkpoint
            self.load_checkpoint(ckpt.resolve_checkpoint(spec, self.output_dir))
        batches = self._batches()
        self._call("on_train_begin")
        if self.resumed_from is None:
            self._eval_and_log()
        running = torch.zeros((), device=self.accelerator.device)
        window_start, window_tokens, window_steps = time.perf_counter(), self.state.tokens_seen, 0
        try:
            while self.state.step < tc.max_steps and not self.should_stop:
                self._call("on_step_begin")
                loss = self.train_step(batches)
                if loss is not None:
                    running += loss
                    window_steps += 1
                self._call("on_step_end")
                step = self.state.step
                if (step % lc.log_every == 0 or step == tc.max_steps) and window_steps:
                    mean = float(self.accelerator.reduce(running, "mean")) / window_steps
                    self.last_train_loss = mean
                    elapsed = time.perf_counter() - window_start
                    tps = (self.state.tokens_seen - window_tokens) / max(elapsed, 1e-9)
                    metrics = {
                        "train/loss": mean,
                        "train/lr": self.scheduler.get_last_lr()[0],
                        "train/tokens_per_s": tps,
                    }
                    if self.skipped_steps:
                        metrics["train/skipped_steps"] = self.skipped_steps
                    self._call("on_log", metrics)
                    running.zero_()
                    window_start, window_tokens, window_steps = (
                        time.perf_counter(),
                        self.state.tokens_seen,
                        0,
                    )
                if step % tc.eval_every == 0 and step != tc.max_steps:
                    self._eval_and_log()
                if tc.save_steps and step % tc.save_steps == 0:
                    self.save_checkpoint()
            if self.last_eval_step != self.state.step:
                self._eval_and_log()
        except BaseException:
            self.finish()
            raise
        if not self.defer_finish:
            self.finish()
        return self.state

    def finish(self) -> None:
        """End of the run for every extension: loggers flush and close (once)."""
        if not getattr(self, "_finished", False):
            self._finished = True
            self._call("on_train_end")

    # -- checkpoints ----------------------------------------------------------------------------

    def _unwrapped(self) -> nn.Module:
        model = self.accelerator.unwrap_model(self.model)
        return getattr(model, "_orig_mod", model)

    def _checkpointed(self) -> nn.Module:
        model = self._unwrapped()
        return model.checkpoint_module() if hasattr(model, "checkpoint_module") else model

    def _protected(self) -> set[str]:
        return {
            e.best_checkpoint
            for e in self.extensions
            if isinstance(e, BestModel) and e.best_checkpoint
        }

    def _agree(self, error: str | None) -> None:
        """Every rank learns whether any rank failed, then all raise the same error together:
        no rank is left waiting at a barrier for a peer that gave up."""
        errors = [error]
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            errors = gather_object([error])
        failed = next((e for e in errors if e is not None), None)
        if failed is not None:
            raise StackWiseError(failed)

    def save_checkpoint(self) -> Path:
        """outputs/<run>/checkpoint-<step>, atomically; see stackwise.train.checkpointing."""
        from stackwise.train.checkpoint import save_model

        acc, step = self.accelerator, self.state.step
        final = self.output_dir / f"checkpoint-{step}"
        tmp = self.output_dir / f".checkpoint-{step}.tmp"
        if step in self._saved_steps:  # best and periodic saves of one step coincide
            return final

        def failure(err: Exception) -> str:
            reason = getattr(err, "strerror", None) or str(err)[:200]
            return (
                f"Could not write checkpoint '{final}' at step {step}: {reason}. Free disk space "
                "or pick another train.output_dir; the previous checkpoints are intact."
            )

        def attempt(action: Any) -> None:
            error = None
            try:
                action()
            except Exception as err:  # disk full shows up as OSError or RuntimeError
                error = failure(err)
            if error is not None and acc.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)
            try:
                self._agree(error)
            except StackWiseError:
                if acc.is_main_process:
                    shutil.rmtree(tmp, ignore_errors=True)
                raise

        def prepare() -> None:
            if acc.is_main_process:
                ckpt.clean_partial(self.output_dir)
                tmp.mkdir(parents=True)

        def rng() -> None:
            (tmp / f"rng_state_{acc.process_index}.json").write_text(json.dumps(ckpt.rng_state()))

        def write() -> None:
            if not acc.is_main_process:
                return
            save_model(self._checkpointed(), tmp)
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.bin")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.bin")
            if acc.scaler is not None:
                torch.save(acc.scaler.state_dict(), tmp / "scaler.bin")
            save_config(self.config, tmp / "config.yaml")
            (tmp / ckpt.STATE).write_text(json.dumps(self._trainer_state(), indent=1))
            ckpt.fsync_tree(tmp)
            if final.exists():  # left by an earlier, abandoned run in this dir
                ckpt.remove_checkpoint(final)
            os.replace(tmp, final)
            ckpt.fsync_dir(self.output_dir)
            ckpt.write_atomic(self.output_dir / ckpt.LATEST, final.name + "\n")
            ckpt.rotate(self.output_dir, self.config.train.save_total_limit, self._protected())

        attempt(prepare)
        attempt(rng)
        attempt(write)
        self._saved_steps.add(step)
        self._call("on_save", final)
        return final

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.state.step,
            "epoch": self.state.epoch,
            "batch_in_epoch": self.state.batch_in_epoch,
            "tokens_seen": self.state.tokens_seen,
            "history": self.state.history,
            "skipped_steps": self.skipped_steps,
            "last_eval_step": self.last_eval_step,
            "world_size": self.accelerator.num_processes,
            "stack_index": getattr(self, "stack_index", None),
            "best_metric": next(
                (e.best for e in self.extensions if isinstance(e, BestModel)), None
            ),
            "extensions": {e.name: e.state_dict() for e in self.extensions},
        }

    def load_checkpoint(self, path: Path) -> None:
        """Weights, optimizer, scheduler, sampler position, RNG and extension states."""
        from stackwise.train.checkpoint import load_weights

        acc = self.accelerator
        state = ckpt.load_json(path / ckpt.STATE)
        if state.get("world_size", 1) != acc.num_processes:
            raise StackWiseError(
                f"Checkpoint '{path}' was written by {state.get('world_size')} processes and this "
                f"run has {acc.num_processes}; the data order would differ. Resume with the same "
                "number of processes."
            )
        module = self._checkpointed()
        if any(not p.is_floating_point() for p in module.parameters()):  # packed quantized
            from stackwise.quant.layers import load_quantized_state

            try:
                load_quantized_state(module, ckpt.load_weights_file(path / "model.safetensors"))
            except (KeyError, RuntimeError) as err:
                raise StackWiseError(
                    f"Checkpoint '{path}' does not match this model ({str(err)[:160]}). It was "
                    "made with another model shape; resume with its own config."
                ) from None
        else:
            load_weights(module, path / "model.safetensors")
        self.optimizer.load_state_dict(ckpt.load_bin(path / "optimizer.bin"))
        self.scheduler.load_state_dict(ckpt.load_bin(path / "scheduler.bin"))
        if acc.scaler is not None and (path / "scaler.bin").is_file():
            acc.scaler.load_state_dict(ckpt.load_bin(path / "scaler.bin"))
        self.state = TrainState(
            step=state["step"],
            epoch=state["epoch"],
            batch_in_epoch=state["batch_in_epoch"],
            tokens_seen=state["tokens_seen"],
            history=state["history"],
        )
        self.skipped_steps = state.get("skipped_steps", 0)
        self.last_eval_step = state.get("last_eval_step")
        self._saved_steps = {self.state.step}
        saved = state.get("extensions", {})
        for ext in self.extensions:
            if ext.name in saved:
                ext.load_state_dict(saved[ext.name])
        # a run that had decided to stop early stays stopped
        self.should_stop = any(
            isinstance(e, EarlyStopping) and e.stopped_at is not None for e in self.extensions
        )
        rng = path / f"rng_state_{acc.process_index}.json"
        ckpt.set_rng_state(ckpt.load_json(rng))
        self.resumed_from = path
        self.logger_note(f"resumed from {path} at step {self.state.step}")

    # -- saving -----------------------------------------------------------------------------

    def save(self, tokenizer: Any = None, weights: bool = True) -> Path:
        """model.safetensors, config.yaml, tokenizer/ and history.json in output_dir."""
        from stackwise.train.checkpoint import save_model

        acc = self.accelerator
        acc.wait_for_everyone()
        if acc.is_main_process:
            model = acc.unwrap_model(self.model)
            model = getattr(model, "_orig_mod", model)
            if weights:
                save_model(model, self.output_dir)
            save_config(self.config, self.output_dir / "config.yaml")
            if tokenizer is not None:
                tokenizer.save_pretrained(str(self.output_dir / "tokenizer"))
            summary = {
                "steps": self.state.step,
                "tokens_seen": self.state.tokens_seen,
                "history": self.state.history,
            }
            (self.output_dir / "history.json").write_text(json.dumps(summary, indent=1))
        acc.wait_for_everyone()
        return self.output_dir
