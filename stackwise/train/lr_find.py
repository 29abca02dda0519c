"""LR range test: train briefly while the LR grows exponentially; suggest where loss falls fastest.

The model and optimizer are snapshotted first and restored afterwards, so the finder can run on
the very Trainer that then trains.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from stackwise.errors import LR_FIND_UNDER_DEEPSPEED, StackWiseError
from stackwise.train.trainer import EnhancedTrainer as Trainer


@dataclass
class LRFindResult:
    lrs: list[float]
    losses: list[float]  # smoothed
    suggestion: float
    stopped_early: bool

    def warnings(self) -> list[str]:
        """What makes the suggestion unreliable, in words a user can act on."""
        found: list[str] = []
        if len(self.lrs) < 5:
            found.append(
                f"the sweep ran {len(self.lrs)} steps, too few to find where the loss falls "
                "fastest; the suggestion (the best LR / 10) is a guess. Raise --steps or lower "
                "--max-lr so the loss does not diverge at once."
            )
        elif not self.lrs[0] <= self.suggestion <= self.lrs[-1]:
            found.append(
                f"the suggestion {self.suggestion:.2e} lies outside the swept range "
                f"{self.lrs[0]:.1e}..{self.lrs[-1]:.1e}; widen --min-lr/--max-lr."
            )
        elif self.suggestion <= self.lrs[2]:
            found.append(
                f"the loss fell fastest at the very start of the sweep ({self.lrs[0]:.1e}); "
                "lower --min-lr to see where the fall begins."
            )
        return found

    def plot(self, path: Path) -> Path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(self.lrs, self.losses)
        ax.axvline(self.suggestion, color="red", linestyle="--", label=f"{self.suggestion:.2e}")
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("training loss (smoothed)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def lr_find(
    trainer: Trainer,
    min_lr: float = 1e-6,
    max_lr: float = 1.0,
    steps: int = 100,
    smoothing: float = 0.05,
    diverge: float = 4.0,
) -> LRFindResult:
    """Exponential LR sweep from min_lr to max_lr; stops once the smoothed loss exceeds
    `diverge` times its best. Group LR ratios (train.group_lr) are kept. The model, the
    optimizer and the data position are restored afterwards."""
    if not (0 < min_lr < max_lr) or steps < 2:
        raise StackWiseError(
            f"lr-find needs 0 < min_lr < max_lr and at least 2 steps (got {min_lr}, {max_lr}, "
            f"{steps})."
        )
    if getattr(trainer.placement.parallelizer, "steps_itself", False):
        raise StackWiseError(LR_FIND_UNDER_DEEPSPEED)
    opt = trainer.optimizer
    saved_model = copy.deepcopy(trainer.unwrapped().state_dict())
    saved_opt = copy.deepcopy(opt.state_dict())
    try:
        lrs, losses, stopped = _sweep(trainer, min_lr, max_lr, steps, smoothing, diverge)
    finally:
        trainer.unwrapped().load_state_dict(saved_model)
        opt.load_state_dict(saved_opt)  # param_groups too: the scheduler's LRs come back
        trainer.state.epoch = trainer.state.batch_in_epoch = 0
        trainer.state.stream_position = None
    if len(lrs) < 2:
        raise StackWiseError(
            f"The loss was not finite from the first steps of the sweep (from {min_lr:.1e}); "
            "lower --min-lr, or check the data and model."
        )
    return LRFindResult(lrs, losses, suggest(lrs, losses), stopped)


def _sweep(
    trainer: Trainer, min_lr: float, max_lr: float, steps: int, smoothing: float, diverge: float
) -> tuple[list[float], list[float], bool]:
    """(LRs, smoothed losses, whether it stopped early) of the sweep's steps."""
    opt = trainer.optimizer
    # group_lr ratios, from the scheduler's base LRs (warmup may have set the current ones to 0)
    base = trainer.config.train.lr
    ratios = [g.get("initial_lr", g["lr"]) / base for g in opt.param_groups]
    batches = trainer.batches()
    factor = (max_lr / min_lr) ** (1.0 / max(steps - 1, 1))
    lrs: list[float] = []
    losses: list[float] = []
    avg, best = 0.0, math.inf
    trainer.model.train()
    for i in range(steps):
        lr = min_lr * factor**i
        for group, ratio in zip(opt.param_groups, ratios, strict=True):
            group["lr"] = lr * ratio
        loss = _sweep_step(trainer, next(batches), i)
        if not math.isfinite(loss):
            return lrs, losses, True
        avg = smoothing * loss + (1 - smoothing) * avg
        smooth = avg / (1 - (1 - smoothing) ** (i + 1))  # bias-corrected
        lrs.append(lr)
        losses.append(smooth)
        best = min(best, smooth)
        if smooth > diverge * best:
            return lrs, losses, True
    return lrs, losses, False


def _sweep_step(trainer: Trainer, batch: dict[str, torch.Tensor], i: int) -> float:
    """One update at the LR already set; returns its (unsmoothed) loss."""
    ctx = trainer.strategy.context
    ctx.gen, ctx.scale = trainer.seeded(i, 0, 0), 1.0
    loss_t = trainer.strategy.compute_loss(trainer.model, batch)
    trainer.accelerator.backward(loss_t)
    loss = float(loss_t.detach())
    clip = trainer.config.train.max_grad_norm
    if clip > 0:
        trainer.accelerator.clip_grad_norm_(trainer.model.parameters(), clip)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return loss


def suggest(lrs: list[float], losses: list[float]) -> float:
    """The LR where the smoothed loss falls fastest (steepest negative slope in log-LR),
    searched before the loss minimum; the minimum's LR / 10 if the curve is too short."""
    if len(lrs) < 5:
        return lrs[int(torch.tensor(losses).argmin())] / 10 if lrs else float("nan")
    end = int(torch.tensor(losses).argmin()) + 1
    logs = torch.tensor(lrs[:end]).log()
    vals = torch.tensor(losses[:end])
    if end < 3:
        return lrs[end - 1] / 10
    slopes = (vals[2:] - vals[:-2]) / (logs[2:] - logs[:-2])
    return lrs[int(slopes.argmin()) + 1]
