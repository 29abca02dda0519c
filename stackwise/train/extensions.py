"""Extensions: callbacks with their own state, checkpointed with the run.

Every hook receives a `RunInfo` (stackwise.train.state): a read-only view of the run, whose
`control` carries requests back (stop, save now). An extension's `state_dict()` must be
JSON-serialisable; it is stored in `trainer_state.json`, handed back to `load_state_dict` on
resume, and then `on_resume` runs. An extension that wants checkpoints kept names them in
`protected_checkpoints()`; rotation never deletes those. User code adds
its own with `@register_extension("name")` and turns it on with
`train.enabled_extensions: [name]`, or `[module:name]` from the command line, which imports the
module (and so registers the name) first.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

from stackwise.errors import StackWiseError
from stackwise.registry import Registry
from stackwise.train.state import RunInfo

HOOKS = (
    "on_train_begin",
    "on_resume",
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

    def on_train_begin(self, run: RunInfo) -> None: ...

    def on_resume(self, run: RunInfo) -> None:
        """After this extension's state came back from a checkpoint."""

    def on_step_begin(self, run: RunInfo) -> None: ...

    def on_step_end(self, run: RunInfo) -> None: ...

    def on_log(self, run: RunInfo, metrics: dict[str, Any]) -> None:
        """`metrics` are prefixed (train/loss, val/nelbo ...)."""

    def on_eval(self, run: RunInfo, metrics: dict[str, float]) -> None: ...

    def on_save(self, run: RunInfo, path: Any) -> None: ...

    def on_stack_begin(self, run: RunInfo, index: int) -> None:
        """Progressive runs: `run` is the stage's (`run.stack_index`, `run.model`);
        on_stack_end comes once the stage is saved and recorded."""

    def on_stack_end(self, run: RunInfo, index: int, record: Any) -> None: ...

    def on_train_end(self, run: RunInfo) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def protected_checkpoints(self) -> set[str]:
        """Names of checkpoints (checkpoint-<step>) that rotation must keep."""
        return set()

    def report(self) -> dict[str, Any]:
        """Top-level entries for trainer_state.json (the best metric, say)."""
        return {}


EXTENSIONS: Registry[Extension] = Registry(
    "extension",
    "register_extension",
    "From the command line, name it module:name (e.g. my_pkg.callbacks:grad_watch) so its "
    "module is imported first.",
)
REGISTRY = EXTENSIONS.entries


def register_extension(name: str) -> Callable[[type[Any]], type[Any]]:
    """Class decorator: makes `name` usable in `train.enabled_extensions`."""
    return EXTENSIONS.register(name)


def build_extensions(names: list[str]) -> list[Extension]:
    """The extensions `names` lists; `module:name` imports the module first, so an extension
    registered in your own code works from the command line too."""
    return [EXTENSIONS.create(_imported(n), "train.enabled_extensions") for n in names]


def _imported(entry: str) -> str:
    """The registered name of an enabled_extensions entry, importing `module` of
    `module:name` (the module registers `name` when imported)."""
    module, sep, name = entry.rpartition(":")
    if not sep:
        return entry
    if not module or not name:
        raise StackWiseError(
            f"train.enabled_extensions entry '{entry}' is malformed; write a registered name or "
            "module:name (e.g. my_pkg.callbacks:grad_watch)."
        )
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or not (module == err.name or module.startswith(f"{err.name}.")):
            raise  # the module exists, and something it imports is missing: its own traceback
        raise StackWiseError(
            f"train.enabled_extensions entry '{entry}' names module '{module}', which cannot "
            f"be imported ({err}). Install it, or put its folder on PYTHONPATH (e.g. "
            "PYTHONPATH=. stackwise train ...)."
        ) from None
    if name not in EXTENSIONS.entries:
        raise StackWiseError(
            f"train.enabled_extensions entry '{entry}': module '{module}' was imported but "
            f"registers no extension '{name}'. Decorate its class with "
            f"@stackwise.register_extension('{name}'). Registered: {EXTENSIONS.known()}."
        )
    return name


def builtin_extensions(config: Any) -> list[Extension]:
    """The extensions the `train` section turns on (best model, early stopping)."""
    tc = config.train
    out: list[Extension] = []
    if tc.save_best_model:
        out.append(BestModel())
    if tc.early_stopping_patience is not None:
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
    """Stops after `early_stopping_patience` evals without an improvement larger than
    `early_stopping_threshold` on `metric_for_best`."""

    def __init__(self) -> None:
        self.best: float | None = None
        self.bad_evals = 0
        self.stopped_at: int | None = None

    def on_eval(self, run: RunInfo, metrics: dict[str, float]) -> None:
        tc = run.config.train
        value = metrics.get(tc.metric_for_best)
        if value is None or tc.early_stopping_patience is None:
            return
        if better(value, self.best, run.greater_is_better, tc.early_stopping_threshold):
            self.best, self.bad_evals = value, 0
            return
        self.bad_evals += 1
        if self.bad_evals >= tc.early_stopping_patience:
            self.stopped_at = run.state.step
            run.control.should_stop = True
            run.note(
                f"early stopping at step {run.state.step}: val/{tc.metric_for_best} has not "
                f"improved by more than {tc.early_stopping_threshold} for {self.bad_evals} evals"
            )

    def on_resume(self, run: RunInfo) -> None:
        if self.stopped_at is not None:  # a run that had decided to stop stays stopped
            run.control.should_stop = True

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "bad_evals": self.bad_evals, "stopped_at": self.stopped_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.bad_evals = state.get("best"), int(state.get("bad_evals", 0))
        self.stopped_at = state.get("stopped_at")
