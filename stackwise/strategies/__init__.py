"""Training strategies: what trains when. A strategy takes a config and prepared data and returns
a trained, saved run; `train_from_config` picks one by name.

Built in: `standard` (the whole model end to end), `local_losses` (every stack at once on its own
detached loss), `progressive` (grow the rack stack by stack; with progressive.mode fused it then
tunes the whole rack). Adding one is a subclass registered with
`@register_training_strategy("name")` (see docs/architecture.md).
"""

from stackwise.strategies.base import (
    STRATEGIES,
    RunResult,
    TrainingStrategy,
    get_training_strategy,
    register_training_strategy,
    strategy_for,
)
from stackwise.strategies.builtin import LocalLosses, Progressive, Standard

__all__ = [
    "STRATEGIES",
    "LocalLosses",
    "Progressive",
    "RunResult",
    "Standard",
    "TrainingStrategy",
    "get_training_strategy",
    "register_training_strategy",
    "strategy_for",
]
