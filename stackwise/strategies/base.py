"""The registry of training strategies, and what a run returns.

A registered strategy is a TrainingStrategy (stackwise.train.strategy: the step) with a `run`:
the recipe that turns a Plan and prepared data into a trained, saved run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from stackwise.data.pack import PreparedData
from stackwise.errors import StackWiseError
from stackwise.train.state import TrainState
from stackwise.train.strategy import (
    STRATEGY_FAMILY,
    TrainingStrategy,
    register_training_strategy,
)


@dataclass
class RunResult:
    config: Any  # the run's Plan
    output_dir: Path
    rack: nn.Module
    data: PreparedData
    state: TrainState | None
    trainer: Any  # the EnhancedTrainer, or the progressive recipe (both expose .accelerator)
    progressive: Any = None  # ProgressiveResult of a progressive run

    def compute(self) -> tuple[float, int]:
        """(training FLOPs, tokens) of the whole run: every stage's, for a grown rack."""
        if self.progressive is not None:
            return self.progressive.compute()
        if self.state is None:
            return 0.0, 0
        return self.state.flops, self.state.tokens_seen


REGISTERED = STRATEGY_FAMILY  # the family (stackwise.registry's protocol)
STRATEGIES = REGISTERED.entries  # name -> class
# `@register_training_strategy(name)` makes `train_from_config(..., strategy=name)` work.
__all__ = [
    "REGISTERED",
    "STRATEGIES",
    "RunResult",
    "check_options",
    "get_training_strategy",
    "register_training_strategy",
    "strategy_for",
]


def get_training_strategy(name: str, config: Any = None, logger: Any = None) -> TrainingStrategy:
    """A new strategy `name` (seed 002: `get_training_strategy("curriculum", training_config)`);
    an unknown name is an error naming the registered ones."""
    return REGISTERED.get(name)(config, logger)


def strategy_for(plan: Any) -> str:
    """The built-in strategy a plan (or config) asks for: a Hugging Face model with LoRA or
    memory layers is fine-tuned (its base frozen)."""
    p = plan.progressive
    if p.strategy == "progressive":
        return "progressive"
    if plan.model.source == "hf" and (plan.lora.enabled or plan.memory_on):
        return "finetuning"
    return "local_losses" if p.end_to_end_scope == "stackwise" else "standard"


def check_options(strategy: TrainingStrategy, options: dict[str, Any]) -> None:
    """train.strategy_options are read by a strategy of your own; StackWise's read none, so
    options given to one of them would do nothing and are refused."""
    if options and type(strategy).__module__.startswith("stackwise."):
        raise StackWiseError(
            f"train.strategy_options sets {', '.join(sorted(options))}, which the "
            f"'{strategy.name}' strategy does not read (StackWise's strategies take their "
            "settings from the config's own keys). Strategy options are for a strategy of "
            "your own (@stackwise.register_training_strategy), which reads them as attributes "
            "of its config; remove them, or pass your strategy to the Trainer."
        )
