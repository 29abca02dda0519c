"""The built-in extensions on the eval metric: keep the best checkpoint, stop when it stalls."""

from __future__ import annotations

import math
from typing import Any

from stackwise.train.extensions import Extension, register_extension
from stackwise.train.state import RunInfo


def builtin_extensions(plan: Any) -> list[Extension]:
    """The extensions the `train` section turns on (best model, early stopping)."""
    tc = plan.train
    out: list[Extension] = []
    if tc.save_best_model:
        out.append(BestModel())
    if tc.stopping_patience() is not None:  # train.early_stopping with its patience
        out.append(EarlyStopping())
    return out


def better(value: float, best: float | None, greater: bool, threshold: float = 0.0) -> bool:
    """Whether `value` improves on `best` by more than `threshold`."""
    if not math.isfinite(value):
        return False
    if best is None:
        return True
    return value > best + threshold if greater else value < best - threshold


@register_extension("best_model")
class BestModel(Extension):
    """Tracks the best eval metric; on each improvement it asks for a checkpoint, which rotation
    never deletes."""

    def __init__(self) -> None:
        self.best: float | None = None
        self.best_step: int | None = None
        self.best_checkpoint: str | None = None

    def on_eval(self, run: RunInfo, metrics: dict[str, float]) -> None:
        tc = run.config.train
        value = metrics.get(tc.metric_for_best)
        if value is None:
            return
        if better(value, self.best, run.greater_is_better):
            self.best, self.best_step = value, run.state.step
            # named now, saved by the Trainer once every extension has seen this eval, so the
            # checkpoint holds their updated state and rotation knows to keep it
            self.best_checkpoint = f"checkpoint-{run.state.step}"
            run.control.should_save = True
            run.note(f"new best val/{tc.metric_for_best} {value:.4f} at step {run.state.step}")

    def protected_checkpoints(self) -> set[str]:
        return {self.best_checkpoint} if self.best_checkpoint else set()

    def report(self) -> dict[str, Any]:
        return {"best_metric": self.best}

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "checkpoint": self.best_checkpoint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_step = state.get("best"), state.get("best_step")
        self.best_checkpoint = state.get("checkpoint")


@register_extension("early_stopping")
class EarlyStopping(Extension):
    """Stops after train.stopping_patience() evals (early_stopping_patience, or its default
    when early_stopping is true) without an improvement larger than `early_stopping_threshold`
    on `metric_for_best`."""

    def __init__(self) -> None:
        self.best: float | None = None
        self.bad_evals = 0
        self.stopped_at: int | None = None

    def watching(self, run: RunInfo) -> tuple[str, int | None, float, bool]:
        """The metric watched, the patience, the threshold and whether greater is better
        (a subclass watches its own: a progressive stage's plateau)."""
        tc = run.config.train
        threshold = tc.early_stopping_threshold
        return tc.metric_for_best, tc.stopping_patience(), threshold, run.greater_is_better

    def stop_note(self, run: RunInfo, metric: str, threshold: float) -> str:
        return (
            f"early stopping at step {run.state.step}: val/{metric} has not improved by more "
            f"than {threshold} for {self.bad_evals} evals"
        )

    def on_eval(self, run: RunInfo, metrics: dict[str, float]) -> None:
        metric, patience, threshold, greater = self.watching(run)
        value = metrics.get(metric)
        if value is None or patience is None:
            return
        if better(value, self.best, greater, threshold):
            self.best, self.bad_evals = value, 0
            return
        self.bad_evals += 1
        if self.bad_evals >= patience:
            self.stopped_at = run.state.step
            run.control.should_stop = True
            run.note(self.stop_note(run, metric, threshold))

    def on_resume(self, run: RunInfo) -> None:
        if self.stopped_at is not None:  # a run that had decided to stop stays stopped
            run.control.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_evals": self.bad_evals, "stopped_at": self.stopped_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.bad_evals = state.get("best"), int(state.get("bad_evals", 0))
        self.stopped_at = state.get("stopped_at")
