"""What a run is at any moment, and what extensions may see and ask of it.

`TrainState` holds every piece of run state that a checkpoint must carry, so `state_dict()` is
derived from it and resuming is `TrainState.from_dict`. Hooks get a `RunInfo`: a read-only view
of the run, with a `Control` through which they ask the Trainer to stop or to save. They never
get the Trainer, so an extension cannot reach into the loop, and the Trainer knows no extension
by name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from stackwise.config import Config


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    tokens_seen: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    skipped_steps: int = 0  # non-finite steps skipped (train.skip_nonfinite_steps)
    last_eval_step: int | None = None
    last_train_loss: float | None = None  # the mean of the last logging window
    resumed_from: str | None = None  # the checkpoint this run continued from
    stream_position: list[int] | None = None  # data.streaming: where the epoch's stream is

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> TrainState:
        """Keys this version does not know are ignored; missing ones keep their defaults."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in names})


@dataclass
class Control:
    """Requests from extensions, read by the Trainer after each round of hooks."""

    should_stop: bool = False
    should_save: bool = False  # a checkpoint now, once every extension has seen this eval


@dataclass(frozen=True)
class Stage:
    """How a progressive stage's Trainer differs from a plain one."""

    index: int | None = None  # the stack being grown (None: joint tuning)
    label: str = "train"  # the progress bar's description, e.g. "stack 2/4"
    # a grown stack's loggers stay open after train() until finish(), so on_stack_end, which
    # comes once the stage is saved, is still logged
    defer_finish: bool = False


class RunInfo:
    """What a hook may read. Attributes are live (the step moves on) but not writable."""

    def __init__(
        self,
        config: Config,
        state: Callable[[], TrainState],
        output_dir: Path,
        is_main: bool,
        greater_is_better: bool,
        stage: Stage,
        extensions: Sequence[Any],
        control: Control,
        note: Callable[[str], None],
        model: Callable[[], Any] = lambda: None,
    ) -> None:
        self._model = model
        self._config, self._state, self._output_dir = config, state, output_dir
        self._is_main, self._greater = is_main, greater_is_better
        self._stage, self._extensions = stage, tuple(extensions)
        self.control, self.note = control, note

    config = property(lambda self: self._config)
    state = property(lambda self: self._state())  # TrainState: read it, do not assign to it
    output_dir = property(lambda self: self._output_dir)
    is_main = property(lambda self: self._is_main)  # the process that writes logs and files
    greater_is_better = property(lambda self: self._greater)  # for train.metric_for_best
    extensions = property(lambda self: self._extensions)
    stack_index = property(lambda self: self._stage.index)
    progress_desc = property(lambda self: self._stage.label)
    # the model being trained, unwrapped (no DDP): read its state, do not swap its parameters
    model = property(lambda self: self._model())

    @property
    def resumed_from(self) -> Path | None:
        saved = self._state().resumed_from
        return Path(saved) if saved else None
