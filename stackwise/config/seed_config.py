"""`TrainingConfig`: a whole config built the way seeds 000, 002 and 004 build theirs, from
flat keywords (`TrainingConfig(mode="blockwise", qlora_enabled=True)`,
`TrainingConfig(model_name_or_path=..., use_lora=True)`), and read or written through the same
flat names (`config.use_lora`, `training_config.enabled_extensions = [...]`)."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError, model_validator

from stackwise.config.aliases import SEED_KEYS, apply_aliases
from stackwise.config.base import ALL_RULES
from stackwise.config.keys import check_keys
from stackwise.config.loading import invalid_config, load_config, validated
from stackwise.config.root import Config
from stackwise.config.seed_view import SeedView
from stackwise.errors import StackWiseError


class StackWiseConfig(Config):
    """A Config as seed 003 loads and checks one: `StackWiseConfig.from_yaml(path)`, then
    `config.validate()` after attribute edits."""

    @classmethod
    def from_yaml(cls, path: str | Path) -> StackWiseConfig:
        """A config file (ours or a seed's layout), loaded and validated."""
        return cls.model_validate(load_config(path).model_dump(mode="json"), context=ALL_RULES)

    def validate(self) -> StackWiseConfig:  # type: ignore[override]
        """Check the whole config again, every rule at once (attribute edits check each value
        alone); returns the checked config and raises naming each problem."""
        checked = validated(self.model_dump(mode="json"), "config")
        for name in type(checked).model_fields:  # what the rules derive (n_stacks) lands here
            self.__dict__[name] = getattr(checked, name)
        return self


class TrainingConfig(StackWiseConfig):
    """A Config that takes the seeds' flat keys beside our sections."""

    @model_validator(mode="before")
    @classmethod
    def _seed_keywords(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        plain = {
            k: v.model_dump(exclude_unset=True) if isinstance(v, BaseModel) else v
            for k, v in data.items()
        }
        plain = apply_aliases(plain)
        _refuse_unknown_keywords(plain)
        check_keys(plain, Config)
        return plain

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise invalid_config(err, "TrainingConfig(...)") from None

    def __getattr__(self, name: str) -> Any:
        train = self.__dict__.get("train")
        if train is not None and name in train.strategy_options:  # a user strategy's setting
            return train.strategy_options[name]
        if name in SEED_KEYS and "." not in name:
            return getattr(SeedView(self, ""), name)
        return super().__getattr__(name)  # type: ignore[misc]

    def __setattr__(self, name: str, value: Any) -> None:
        if name in SEED_KEYS and "." not in name and name not in type(self).model_fields:
            setattr(SeedView(self, ""), name, value)
            return
        super().__setattr__(name, value)


def _refuse_unknown_keywords(plain: dict[str, Any]) -> None:
    """A keyword that is neither a seed's flat name nor one of our sections, refused with the
    nearest of both and the whole list of each."""
    unknown = [k for k in plain if k not in Config.model_fields]
    if not unknown:
        return
    flat = sorted(p for p in SEED_KEYS if "." not in p)
    sections = list(Config.model_fields)
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), flat + sections, n=1, cutoff=0.6)
        hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
    raise StackWiseError(
        f"TrainingConfig(...) has no keyword {', '.join(hints)}. It takes the seeds' flat "
        f"names ({', '.join(flat)}) and our sections as dicts or section objects "
        f"({', '.join(sections)}); `stackwise config show --aliases` says where each seed "
        "name lands."
    )
