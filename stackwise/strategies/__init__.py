"""Training strategies: what trains when. A registered strategy is a TrainingStrategy whose
`train_step` is the step and whose `run` turns a Plan and prepared data into a trained, saved
run; `train_from_config` picks one by name.

Built in, one file each: `standard` (the whole model end to end), `local_losses` (every stack
at once on its own detached loss), `progressive` (grow the rack stack by stack; with
progressive.mode fused it then tunes the whole rack), `finetuning` (the base frozen, its
adapters trained). Adding one is a subclass registered with
`@register_training_strategy("name")` (see docs/architecture.md).
"""

from stackwise.strategies.base import (
    STRATEGIES,
    RunResult,
    check_options,
    get_training_strategy,
    register_training_strategy,
    strategy_for,
)
from stackwise.strategies.finetune import FinetuningStrategy
from stackwise.strategies.local_losses import LocalLosses, LocalLossStrategy
from stackwise.strategies.progressive import Progressive, ProgressiveStrategy
from stackwise.strategies.standard import Standard, StandardTrainingStrategy
from stackwise.train.strategy import TrainingStrategy

__all__ = [
    "STRATEGIES",
    "FinetuningStrategy",
    "LocalLossStrategy",
    "LocalLosses",
    "Progressive",
    "ProgressiveStrategy",
    "RunResult",
    "Standard",
    "StandardTrainingStrategy",
    "TrainingStrategy",
    "check_options",
    "get_training_strategy",
    "register_training_strategy",
    "strategy_for",
]
