"""Extensions: callbacks with their own state, checkpointed with the run.

Every hook receives the Trainer. An extension's `state_dict()` must be JSON-serialisable; it is
stored in `trainer_state.json` and handed back to `load_state_dict` on resume. User code adds
its own with `@register_extension("name")` and turns it on with
`train.enabled_extensions: [name]`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stackwise.errors import StackWiseError

if TYPE_CHECKING:
    from stackwise.train.trainer import Trainer

HOOKS = (
    "on_train_begin",
    "on_step_begin",
    "on_step_end",
    "on_log",
    "on_eval",
    "on_save",
    "on_stack_begin",
    "on_stack_end",
    "on_train_end",
)


class Extension:
    """Override the hooks you need; the defaults do nothing."""

    name = "extension"

    def on_train_begin(self, trainer: Trainer) -> None: ...

    def on_step_begin(self, trainer: Trainer) -> None: ...

    def on_step_end(self, trainer: Trainer) -> None: ...

    def on_log(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        """`metrics` are prefixed (train/loss, val/nelbo ...)."""

    def on_eval(self, trainer: Trainer, metrics: dict[str, float]) -> None: ...

    def on_save(self, trainer: Trainer, path: Any) -> None: ...

    def on_stack_begin(self, trainer: Any, index: int) -> None:
        """Progressive runs: `trainer` is the stage's Trainer (`trainer.progressive` is the
        ProgressiveTrainer); on_stack_end comes once the stage is saved and recorded."""

    def on_stack_end(self, trainer: Any, index: int, record: Any) -> None: ...

    def on_train_end(self, trainer: Trainer) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


REGISTRY: dict[str, Callable[..., Extension]] = {}


def register_extension(name: str) -> Callable[[type[Extension]], type[Extension]]:
    """Class decorator: makes `name` usable in `train.enabled_extensions`."""

    def add(cls: type[Extension]) -> type[Extension]:
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return add


def build_extensions(names: list[str]) -> list[Extension]:
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise StackWiseError(
            f"train.enabled_extensions names '{unknown[0]}', which is not registered. Known: "
            f"{', '.join(sorted(REGISTRY))}. Register yours with "
            "@stackwise.register_extension('name') before training."
        )
    return [REGISTRY[n]() for n in names]


def better(value: float, best: float | None, greater: bool, threshold: float = 0.0) -> bool:
    """Whether `value` improves on `best` by more than `threshold`."""
    if not math.isfinite(value):
        return False
    if best is None:
        return True
    return value > best + threshold if greater else value < best - threshold


@register_extension("best_model")
class BestModel(Extension):
    """Tracks the best eval metric; on each improvement the Trainer saves a checkpoint, which
    rotation never deletes."""

    def __init__(self) -> None:
        self.best: float | None = None
        self.best_step: int | None = None
        self.best_checkpoint: str | None = None

    def on_eval(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        tc = trainer.config.train
        value = metrics.get(tc.metric_for_best)
        if value is None:
            return
        if better(value, self.best, trainer.greater_is_better):
            self.best, self.best_step = value, trainer.state.step
            # named now, saved by the Trainer once every extension has seen this eval, so the
            # checkpoint holds their updated state and rotation knows to keep it
            self.best_checkpoint = f"checkpoint-{trainer.state.step}"
            trainer.save_requested = True
            trainer.logger_note(
                f"new best val/{tc.metric_for_best} {value:.4f} at step {trainer.state.step}"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "checkpoint": self.best_checkpoint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_step = state.get("best"), state.get("best_step")
        self.best_checkpoint = state.get("checkpoint")


@register_extension("early_stopping")
class EarlyStopping(Extension):
    """Stops after `early_stopping_patience` evals without an improvement larger than
    `early_stopping_threshold` on `metric_for_best`."""

    def __init__(self) -> None:
        self.best: float | None = None
        self.bad_evals = 0
        self.stopped_at: int | None = None

    def on_eval(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        tc = trainer.config.train
        value = metrics.get(tc.metric_for_best)
        if value is None or tc.early_stopping_patience is None:
            return
        if better(value, self.best, trainer.greater_is_better, tc.early_stopping_threshold):
            self.best, self.bad_evals = value, 0
            return
        self.bad_evals += 1
        if self.bad_evals >= tc.early_stopping_patience:
            self.stopped_at = trainer.state.step
            trainer.should_stop = True
            trainer.logger_note(
                f"early stopping at step {trainer.state.step}: val/{tc.metric_for_best} has not "
                f"improved by more than {tc.early_stopping_threshold} for {self.bad_evals} evals"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_evals": self.bad_evals, "stopped_at": self.stopped_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.bad_evals = state.get("best"), int(state.get("bad_evals", 0))
        self.stopped_at = state.get("stopped_at")
