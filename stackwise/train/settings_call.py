"""The seeds' ways to make a Trainer from settings (`Trainer(config)`, `Trainer(config,
model=m)`, `EnhancedTrainer(model_config=..., training_config=..., data_config=...)`).

They need the config door, a layer above the training loop: stackwise.fronts.trainer registers
the function that builds them in SEED_FRONT (importing the Trainer from `stackwise` does), and
`FromSettings.__new__` routes such a call there instead of to the loop's own constructor, which
takes parts already built (stackwise.train.builders).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stackwise.errors import StackWiseError

SEED_FRONT: list[Callable[..., Any]] = []


def from_settings(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A call without the built parts (placement and data) is a seed's call from settings."""
    return len(args) < 4 and "placement" not in kwargs


class FromSettings:
    """A class whose settings-call is built by the seeds' front (see the module)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if not from_settings(args, kwargs):
            return super().__new__(cls)
        if not SEED_FRONT:
            raise StackWiseError(
                "Trainer(config) and EnhancedTrainer(model_config=..., training_config=...) "
                "are built by stackwise.fronts.trainer: import the class from stackwise "
                "(`from stackwise import Trainer`), which loads it."
            )
        return SEED_FRONT[0](*args, **kwargs)
