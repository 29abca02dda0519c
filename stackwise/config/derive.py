"""Configs made from configs: a stage's, a merged rack's, a sampling run's.

Every such change goes through `derive`, so the result is validated by every rule like a config
the user wrote, and an impossible change is one clear error.
"""

from __future__ import annotations

from typing import Any

from stackwise.config.loading import validated
from stackwise.config.paths import put
from stackwise.config.root import Config


def derive(config: Config, changes: dict[str, Any], origin: str = "a derived config") -> Config:
    """`config` with `changes` applied: dotted path -> value (a section path replaces it)."""
    data = config.model_dump(mode="json")
    for path, value in changes.items():
        put(data, path, value, origin)
    return validated(data, origin)


def stack_config(config: Config, index: int) -> Config:
    """The config stack `index` trains with: its objective/masking/LR overrides applied.

    Budgets (steps, epochs) are resolved by the progressive trainer, which knows the data size.
    """
    over = config.progressive.stacks.get(index)
    if over is None:
        return config
    changes: dict[str, Any] = {"progressive.stacks": {}}
    if over.objective is not None:
        changes["objective"] = over.objective.model_dump(mode="json")
    for key, value in (over.masking or {}).items():
        changes[f"masking.{key}"] = value
    if over.lr is not None:
        changes["train.lr"] = over.lr
    return derive(config, changes, f"stack {index}")
