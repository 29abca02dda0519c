"""The seeds' config layouts: every key a seed document writes, and the real key it lands on.

A seed layout is a table of paths as the seed writes them (`training.max_length`,
`training.progressive.cache_activations`, a flat `qlora_rank`, `qlora.lr`) and, for each, the
dotted key of ours that does what the seed says, optionally with a value conversion
(`mixed_precision: true` -> `auto`). One table per seed document (unified, infrastructure,
enhanced, progressive, model_trainer); `stackwise config show --aliases` prints them all and
`config show --as-seed N` writes a config back in seed N's layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stackwise.config.paths import put, section_at

Convert = Callable[[Any], Any]


@dataclass(frozen=True)
class SeedKey:
    """`target`: our dotted key; `convert`: the seed's value -> ours (None: as given);
    `note`: what the seed means, where the key's own description does not say it."""

    target: str
    convert: Convert | None = None
    note: str = ""


@dataclass(frozen=True)
class Layout:
    """One seed's keys: `keys` maps the seed's dotted path (as written in its files or given
    to its constructors) to a SeedKey; `values` renames values of our keys in place;
    `implied(given, data)`, when the seed's keys were given (`given`: seed path -> value as
    written), sets in `data` (our keys, aliased) what the seed's meaning implies and the
    config leaves unset (seed 000: a training mode means growth)."""

    seed: str
    title: str
    keys: dict[str, SeedKey]
    values: dict[str, dict[str, str]] = field(default_factory=dict)
    implied: Callable[[dict[str, Any], dict[str, Any]], None] | None = None


def keys(table: dict[str, str | SeedKey]) -> dict[str, SeedKey]:
    """A table written with plain targets where no conversion is needed."""
    return {k: v if isinstance(v, SeedKey) else SeedKey(v) for k, v in table.items()}


NOT_SEED = object()  # a value of ours that the seed's key cannot spell (stays in our sections)


@dataclass(frozen=True)
class Switch:
    """A seed's on/off switch for a key of ours that takes a name (`true` -> `auto`)."""

    true: Any
    false: Any

    def __call__(self, value: Any) -> Any:
        if isinstance(value, bool):
            return self.true if value else self.false
        return value  # anything else: our key's own check names the problem

    def reverse(self, value: Any) -> Any:
        """Our value as the seed writes it (for `config show --as-seed`)."""
        if value == self.true and not isinstance(value, bool):
            return True
        if value == self.false and not isinstance(value, bool):
            return False
        return NOT_SEED


def boolean_to(true: Any, false: Any) -> Convert:
    return Switch(true, false)


def seed_value(key: SeedKey, value: Any) -> Any:
    """Our value of `key.target` as the seed's key spells it, or NOT_SEED."""
    if key.convert is None:
        return value
    reverse = getattr(key.convert, "reverse", None)
    return NOT_SEED if reverse is None else reverse(value)


def get_path(data: dict[str, Any], path: str, default: Any = None) -> Any:
    """A dotted key of a config's plain data, or `default` where it is not set."""
    *where, name = path.split(".")
    node = section_at(data, where, create=False)
    return default if node is None else node.get(name, default)


def fill(data: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted key that the config leaves unset (what a seed's keys imply never
    overrides what the config says)."""
    *where, name = path.split(".")
    node = section_at(data, where, create=False)
    if node is None or name not in node:
        put(data, path, value, path)
