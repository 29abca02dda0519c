"""The strategy interface, its registry, and what a run returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from stackwise.config import Config
from stackwise.data.pack import PreparedData
from stackwise.registry import Registry
from stackwise.train.adapters import ModelAdapter
from stackwise.train.state import TrainState


@dataclass
class RunResult:
    config: Config
    output_dir: Path
    rack: nn.Module
    data: PreparedData
    state: TrainState | None
    trainer: Any  # Trainer, or ProgressiveTrainer (both expose .accelerator)
    progressive: Any = None  # ProgressiveResult of a progressive run


class TrainingStrategy(ABC):
    name = "strategy"

    @abstractmethod
    def run(
        self, config: Config, data: PreparedData, adapter: ModelAdapter, quiet: bool
    ) -> RunResult:
        """Train the model `adapter` builds for `config` on `data`, save it, return the run."""


REGISTERED: Registry[TrainingStrategy] = Registry("training strategy", "register_training_strategy")
STRATEGIES = REGISTERED.entries
# `@register_training_strategy(name)` makes `train_from_config(..., strategy=name)` work.
register_training_strategy = REGISTERED.register
get_training_strategy = REGISTERED.create


def strategy_for(config: Config) -> str:
    """The built-in strategy a config asks for."""
    p = config.progressive
    if p.strategy == "progressive":
        return "progressive"
    return "local_losses" if p.end_to_end_scope == "stackwise" else "standard"
