"""What a run is at any moment, and what extensions may see and ask of it.

`TrainState` holds every piece of run state that a checkpoint must carry, so `state_dict()` is
derived from it and resuming is `TrainState.from_dict`. Hooks get a `RunInfo`: a read-only view
of the run, with a `Control` through which they ask the Trainer to stop or to save. They never
get the Trainer, so an extension cannot reach into the loop, and the Trainer knows no extension
by name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    tokens_seen: int = 0
    flops: float = 0.0  # training FLOPs of this run (stackwise.train.flops), every rank's
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
    # what the run spent before this stage (earlier stages, carrying the cache), so logged
    # FLOPs and tokens are the whole run's
    flops_before: float = 0.0
    tokens_before: int = 0


class Live:
    """The parts of a run that move while it trains: its state (replaced on resume) and the
    model being trained. The Trainer owns one; RunInfo reads through it."""

    def __init__(self, state: TrainState, model: Callable[[], Any] = lambda: None) -> None:
        self.state, self.model = state, model


@dataclass(frozen=True)
class RunInfo:
    """What a hook may read: fixed facts of the run, and live views of its state and model.
    Frozen: a hook cannot reassign anything; it asks through `control`."""

    plan: Any  # the run's Plan (stackwise.spec): read its sections, never change them
    output_dir: Path
    is_main: bool  # the process that writes logs and files
    greater_is_better: bool  # for train.metric_for_best
    stage: Stage
    extensions: tuple[Any, ...]
    control: Control
    note: Callable[[str], None]
    sinks: tuple[Any, ...] = ()  # the metrics' destinations (console, JSONL, TensorBoard...)
    live: Live = field(repr=False, default_factory=lambda: Live(TrainState()))

    @property
    def config(self) -> Any:
        """The plan, under the name extensions written against a config know."""
        return self.plan

    @property
    def state(self) -> TrainState:
        return self.live.state

    @property
    def model(self) -> Any:
        """The model being trained, unwrapped (no DDP): read it, do not swap its parameters."""
        return self.live.model()

    @property
    def stack_index(self) -> int | None:
        return self.stage.index

    @property
    def progress_desc(self) -> str:
        return self.stage.label

    @property
    def resumed_from(self) -> Path | None:
        saved = self.live.state.resumed_from
        return Path(saved) if saved else None
